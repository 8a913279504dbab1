"""The planner's throughput model: tokens per second per GPU for generate, extract and train on given GPUs, and
where each figure came from. One function for the plan's configured pools and every topology `--compare` prices.

- generation (decode) is bandwidth bound: tokens/s = batch * efficiency * bandwidth / weight bytes a step reads;
- extraction (prefill) is compute bound: tokens/s = efficiency * FLOP/s / (2 * active params * deepest layer /
  layers);
- training: flashdraft/perf/flops.py's FLOPs a token at `plan.train_efficiency` of the trainer GPU's dense BF16 peak.

Precedence: `plan.measured_tokens_per_s` (the configured pools only) > calibration file > model; a calibrated rate
carries to another GPU by its share of the bandwidth or peak (resources.py `calibrate_rates`). An FP8 target
(`plan.target_precision=fp8`) reads half the weight bytes a decode step and, on GPUs with FP8 tensor cores, runs
prefill at twice the BF16 peak (an A100 has none: weight-only FP8, prefill at BF16): assumed, never measured here.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashdraft.components.plan.gpus import GpuSpec
from flashdraft.components.plan.memory import WEIGHT_BYTES
from flashdraft.components.plan.resources import calibrate_rates
from flashdraft.config import RunConfig
from flashdraft.perf.calibration import Calibration

STAGES = ("generate", "extract", "train")
FP8_NOTE = "; FP8 weights assumed"


@dataclass(frozen=True)
class TargetCost:
    """What the target costs a token: parameters held, parameters run, and the prefill's FLOPs a token."""

    params: float                # every expert: what the inference GPUs hold
    active: float                # what a token runs through
    num_experts: int
    experts_per_token: int
    extract_flops_per_token: float  # 2 x active params x (deepest captured layer + 1) / layers


@dataclass(frozen=True)
class Rates:
    """tokens/s per GPU by stage (None without a GPU) and where each came from."""

    tokens_per_s: dict[str, float | None]
    sources: dict[str, str]


def decode_weight_bytes(total: float, active: float, experts: int, per_token: int, batch: int) -> float:
    """bf16 weight bytes one decode step of `batch` sequences reads: every dense weight, and of an MoE's routed
    experts the share the batch touches (1 - (1 - k/E)^batch; ~all of them at a batch of 64 with 8 of 128)."""
    if not experts or not per_token or active >= total:
        return 2 * total
    routed = (total - active) * experts / (experts - per_token)
    touched = 1 - (1 - per_token / experts) ** batch
    return 2 * ((total - routed) + routed * touched)


def stage_rates(cfg: RunConfig, target: TargetCost, inf_gpu: GpuSpec | None, train_gpu: GpuSpec | None,
                train_flops_per_token: float, cal: Calibration | None, precision: str = "bf16",
                measured: dict[str, float] | None = None) -> Rates:
    """Rates of the three stages with the target on `inf_gpu` in `precision` and the trainer on `train_gpu`.
    `measured`: the plan.measured_tokens_per_s entries that apply (they were measured on the configured pools);
    None: all of them."""
    p = cfg.plan
    measured = p.measured_tokens_per_s if measured is None else measured
    weight_share = WEIGHT_BYTES[precision] / 2
    fp8_peak = precision == "fp8" and inf_gpu is not None and inf_gpu.fp8
    extract_flops = target.extract_flops_per_token / (2 if fp8_peak else 1)  # FP8 peak = 2x BF16
    rates: dict[str, float | None] = {s: measured.get(s) for s in STAGES}
    if inf_gpu and rates["generate"] is None:
        weight_bytes = weight_share * decode_weight_bytes(target.params, target.active, target.num_experts,
                                                          target.experts_per_token, p.decode_batch)
        rates["generate"] = p.decode_batch * p.decode_efficiency * inf_gpu.bandwidth_gbs * 1e9 / weight_bytes
    if inf_gpu and rates["extract"] is None:
        rates["extract"] = p.prefill_efficiency * inf_gpu.bf16_tflops * 1e12 / extract_flops
    if train_gpu and rates["train"] is None:
        rates["train"] = p.train_efficiency * train_gpu.bf16_tflops * 1e12 / train_flops_per_token
    sources = {s: "plan.measured_tokens_per_s" if s in measured else "assumed (model)" for s in STAGES}
    if cal is not None:
        gpus = {"generate": inf_gpu, "extract": inf_gpu, "train": train_gpu}
        sources.update(calibrate_rates(cfg, cal, rates, {
            "extract": extract_flops, "train": train_flops_per_token,
            "generate_bytes": target.params * WEIGHT_BYTES[precision] / p.decode_batch}, gpus, set(measured)))
    if precision == "fp8":
        sources = {s: v + FP8_NOTE if s != "train" and not v.startswith("plan.") else v for s, v in sources.items()}
    return Rates(rates, sources)
