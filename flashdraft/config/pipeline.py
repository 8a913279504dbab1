"""Config sections of how the pipeline runs: the mode (offline or streaming), the node pools and where each stage
runs, and the planner's knobs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from flashdraft.config.base import Section


class ModeConfig(Section):
    """Offline (extract everything, then train) or streaming (extract and train concurrently through a bounded
    window of parts in the store). The mode is part of the compiled DAG."""

    kind: Literal["offline", "streaming"] = Field(
        default="offline", description="offline keeps every feature part until training ends; streaming bounds "
        "the store to mode.window_bytes and deletes parts once trained on mode.reuse times")
    window_bytes: int = Field(default=64 * 2**30, ge=1, description="streaming: most feature bytes stored at "
                              "once (producers wait for room); plan's peak estimate")
    window_shards: int = Field(default=64, ge=1, description="streaming: most feature parts stored at once")
    reuse: int = Field(default=2, ge=1, description="streaming: times each shard is trained on before deletion")


class PoolConfig(Section):
    """Where a stage runs: node selector, tolerations, accelerator and requests (Kubernetes only)."""

    node_selector: dict[str, str] = Field(default_factory=dict, description="node labels the pool's pods "
                                          "require (nodeSelector)")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Kubernetes tolerations of the "
                                              "pool's pods (e.g. for tainted GPU nodes)")
    gpu_type: str | None = Field(default=None, description="planner GPU name, e.g. rtx-pro-6000, b200 (plan's "
                                 "throughput model); not a scheduling constraint")
    accelerator_type: str | None = Field(default="nvidia.com/gpu", description="extended resource name of the "
                                         "accelerator limit; None = no accelerator")
    accelerator_count: int = Field(default=0, ge=0, description="accelerators per pod (per node for a TrainJob)")
    cpu_request: str = Field(default="2", description="pod CPU request (Kubernetes quantity); also "
                             "the pod's CPU limit")
    memory_request: str = Field(default="8Gi", description="pod memory request (Kubernetes quantity); also the "
                                "pod's memory limit (a memory-backed /dev/shm counts inside it)")
    ephemeral_storage_request: str = Field(default="50Gi", description="node-local disk a pod of this pool may "
                                           "write (Kubernetes quantity), the caches under /cache (Hub, vLLM, "
                                           "Triton) first: the size limit of a stage pod's /cache volume; on "
                                           "TrainJob nodes (/cache and /tmp) the ephemeral-storage request and "
                                           "limit")
    shm_size: str | None = Field(default=None, description="size of a memory-backed /dev/shm (NCCL and "
                                 "dataloaders need more than the container default); None = the default")
    usd_per_gpu_hour: float | None = Field(default=None, gt=0, description="what one of this pool's GPUs costs "
                                           "an hour (plan's cost); None = plan.prices.gpu_usd_per_hour of its "
                                           "gpu_type")


class PoolsConfig(Section):
    """The three node pools and which stage runs on which (the compiled pipeline's placement; plan's GPUs)."""

    cpu: PoolConfig = Field(default_factory=lambda: PoolConfig(accelerator_type=None),
                            description="CPU-only pool: plan, prep, export, report")
    inference: PoolConfig = Field(default_factory=PoolConfig, description="GPU pool for the target's forwards: "
                                  "generate, extract, evaluate")
    trainer: PoolConfig = Field(default_factory=PoolConfig, description="GPU pool for train")
    stage_pool: dict[str, Literal["cpu", "inference", "trainer"]] = Field(
        default_factory=dict, description="stage -> pool, for a stage placed elsewhere than its declared pool "
        "(components/<stage>/stage.py); a stage not named runs on its declared pool (the registry supplies it: "
        "flashdraft/run/registry.py `pool_name`)")


# Public on-demand list prices per GPU-hour, May 2026: the sources, and what each figure is, in docs/planning.md
# ("Prices"). A default, not a quote: set your own (plan.prices.gpu_usd_per_hour.<gpu>, pools.<pool>.usd_per_gpu_hour).
DEFAULT_GPU_USD_PER_HOUR = {"b200": 5.99, "h200": 3.79, "h100": 2.95, "rtx-pro-6000": 1.29, "a100": 1.29,
                            "l40s": 0.92}


class PriceConfig(Section):
    """What the plan's cost figures charge (`flashdraft plan --compare`): GPU-hours by GPU type, storage by TB-month
    and transfer by GB. Defaults dated and sourced in docs/planning.md; always overridable."""

    gpu_usd_per_hour: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_GPU_USD_PER_HOUR), description="per planner GPU type (pools.*.gpu_type), "
        "US$ per GPU-hour; a pool's own pools.<pool>.usd_per_gpu_hour wins for that pool's GPU type")
    @field_validator("gpu_usd_per_hour")
    @classmethod
    def _over_the_defaults(cls, prices: dict[str, float]) -> dict[str, float]:
        """A price set for one GPU (`--set plan.prices.gpu_usd_per_hour.b200=4`) keeps the others' defaults."""
        bad = [g for g, v in prices.items() if v <= 0]
        if bad:
            raise ValueError(f"prices must be > 0, got {', '.join(f'{g}={prices[g]}' for g in bad)}")
        return {**DEFAULT_GPU_USD_PER_HOUR, **prices}

    storage_usd_per_tb_month: float = Field(default=23.0, ge=0, description="object storage, US$ per TB (1e12 "
                                            "bytes) a month (730 hours); S3 Standard's list price")
    transfer_usd_per_gb: float = Field(default=0.0, ge=0, description="US$ per GB (1e9 bytes) of features moved "
                                       "from the inference pool to the trainer pool when they sit in different "
                                       "places (egress); 0 = same place")


class PlanConfig(Section):
    """Planner knobs: GPU spec and throughput overrides (measured rates beat the model)."""

    gpu_overrides: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="per GPU name, spec fields replacing the built-in table, e.g. "
        "{b200: {bf16_tflops: 2000}}")
    prefill_efficiency: float = Field(default=0.4, gt=0, le=1, description="share of the inference GPU's dense "
                                      "BF16 peak that extraction's forwards reach")
    decode_efficiency: float = Field(default=0.5, gt=0, le=1, description="share of the inference GPU's memory "
                                     "bandwidth generation's decode reaches")
    train_efficiency: float = Field(default=0.35, gt=0, le=1, description="share of the trainer GPU's dense BF16 "
                                    "peak training reaches")
    measured_tokens_per_s: dict[str, float] = Field(
        default_factory=dict, description="per stage (generate/extract/train), per GPU; replaces the model"
    )
    decode_batch: int = Field(default=64, ge=1, description="sequences decoded together per weight read in "
                              "the generation model")
    eval_tau: float = Field(default=3.0, ge=1, description="tokens a speculative cycle (accepted drafts + the "
                            "bonus) assumed when pricing evaluate: a trained DFlash drafter measures 3-7, an "
                            "untrained one 1 (components/plan/evaluate_plan.py)")
    response_fraction: float = Field(default=0.75, gt=0, le=1, description="share of a sample's tokens generated")
    target_params: float | None = Field(
        default=None, gt=0, description="target parameter count; default: the target's (its config, else "
        "target.params, else estimated from layers x width); a value the model's own count contradicts is refused")
    target_vocab: int | None = Field(
        default=None, ge=1, description="vocabulary size for the LM-head cost; default: the target's (its config, "
        "else target.vocab_size, else assumed 151,936); a value the model's config contradicts is refused")
    target_kv_bytes_per_token: float | None = Field(
        default=None, gt=0, description="vLLM KV-cache bytes per token over all full-attention target layers (bf16 K "
        "and V: 4 x layers x kv_heads x head_dim); default: from the target's config, else (hints) 4 x num_layers "
        "x hidden_size, an upper bound")
    target_state_bytes_per_sequence: float | None = Field(
        default=None, ge=0, description="fixed-size cache per sequence: recurrent state over all linear-attention "
        "(Gated DeltaNet) target layers, SSM state plus convolution cache, as vLLM holds it, and sliding-window "
        "layers' K/V; default: from the target's config (0 when planning from hints)")
    target_intermediate_size: int | None = Field(
        default=None, ge=1, description="the target's MLP width, for activation workspaces; default 4 x hidden_size")
    calibration: str | None = Field(
        default=None, description="a calibration JSON (flashdraft/perf/calibration.py; `flashdraft plan --calibrate`): "
        "its measured rates and trainer peaks replace the assumed ones")
    prices: PriceConfig = Field(default_factory=PriceConfig, description=PriceConfig.__doc__)
    inference_gpus: int = Field(default=8, ge=1, description="inference-pool GPUs the run uses at once, for the "
                                "plan's wall-clock days (the trainer's are training.nproc_per_node x num_nodes)")
    hub_bandwidth_gbps: float = Field(
        default=0.2, gt=0, description="GB/s the run's one download of the target's pinned snapshot from the Hub "
        "(or HF_ENDPOINT's mirror) reaches, for the plan's fetch minutes (docs/cluster.md, Model cache)")
    train_variants: int = Field(
        default=1, ge=1, description="trainings that will read the same features (a sweep's variants): offline "
        "rows pay generation and extraction once and training this many times and hold the features for the whole "
        "sweep; streaming rows pay extraction (the target's prefill) this many times, since nothing is kept")
    target_precision: Literal["bf16", "fp8"] = Field(
        default="bf16", description="precision the inference pool holds the target's weights in, for plan's memory "
        "and rates: fp8 plans an FP8 checkpoint (e.g. Qwen/Qwen3.6-27B-FP8; set target.model to run it). Features "
        "must come from the precision that will be served")
    check_sources: bool = Field(
        default=True, description="the pipeline's plan task opens every hf: data source and eval suite before any "
        "GPU task (access with HF_TOKEN, revision, config, splits; rows where the card says) and refuses in one line "
        "naming what exists; false skips it (a plan pod that cannot reach HF_ENDPOINT: prep and evaluate then fail "
        "later on the same errors)")
    max_cost_usd: float | None = Field(default=None, gt=0, description="the plan gate stops a run whose planned "
                                       "cost (GPUs, storage, transfer) exceeds this, naming cheaper topologies")
    deadline_days: float | None = Field(default=None, gt=0, description="the plan gate stops a run whose planned "
                                        "wall-clock days exceed this, naming faster topologies")
    zstd_ratio: dict[str, float] = Field(
        default_factory=lambda: {"bf16-zstd": 0.71, "fp8-zstd": 0.86}, description="compressed / raw size of the "
        "zstd codecs; defaults measured by `make bench` on SmolLM2 features")
