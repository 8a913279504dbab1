#!/usr/bin/env bash
# The install steps all three images share, so their Dockerfiles differ only in base image and environment.
#
#   install.sh torch INDEX_URL VERSION
#                                  the pinned torch from its CPU or CUDA wheel index (base and trainer images; the
#                                  vLLM image brings its own)
#   install.sh user [DIR ...]      non-root user APP_UID (10001) owning /cache/huggingface, /work and DIRs
#   install.sh deps MODE [EXTRA ...]
#                                  flashdraft's requirements (base + EXTRAs, without torch: each image installs
#                                  its own CPU/CUDA build of the pinned version first). MODE says what pip may not
#                                  swap: `keep-torch` pins the preinstalled torch, `keep-all` pins every package
#                                  already in the image (the vLLM image: its CUDA torch, vLLM and their libraries).
#   install.sh app MODULE ...      the package itself (--no-deps: every dependency is in the layer below), then an
#                                  import smoke test of MODULEs and of the console script.
#
# Runs from /opt/flashdraft, where the Dockerfile copied pyproject.toml and docker/requirements.py.
# pip settings live here, not in the images' ENV: only these build steps run pip.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
APP_UID="${APP_UID:-10001}"
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

step="$1"
shift
case "$step" in
  torch)
    "$PYTHON" -m pip install --index-url "$1" "torch==$2"
    ;;
  user)
    useradd --uid "$APP_UID" --create-home --shell /usr/sbin/nologin flashdraft
    mkdir -p /cache/huggingface /work "$@"
    chown -R "$APP_UID" /cache /work
    ;;
  deps)
    mode="${1:-}"
    shift || true
    case "$mode" in
      keep-torch) "$PYTHON" -m pip list --format=freeze | grep -i '^torch==' > /tmp/constraints.txt ;;
      keep-all) "$PYTHON" -m pip list --format=freeze > /tmp/constraints.txt ;;
      *) echo "install.sh deps: MODE must be keep-torch or keep-all, got '$mode'" >&2; exit 2 ;;
    esac
    "$PYTHON" requirements.py pyproject.toml "$@" --skip torch > /tmp/requirements.txt
    "$PYTHON" -m pip install -r /tmp/requirements.txt -c /tmp/constraints.txt
    rm /tmp/requirements.txt /tmp/constraints.txt
    ;;
  app)
    "$PYTHON" -m pip install --no-deps .
    for module in "$@"; do "$PYTHON" -c "import $module"; done
    flashdraft --help > /dev/null
    ;;
  *)
    echo "install.sh: unknown step '$step' (torch, user, deps, app)" >&2
    exit 2
    ;;
esac
