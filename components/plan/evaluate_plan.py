"""The plan's price of the evaluate stage (GPU-hours and wall time on the evaluate pool's GPU) and its refusal of a
suite list that cannot finish inside evaluate's timeout.

What evaluate runs on a GPU (components/evaluate/evaluate.py), each part priced as the planner's decode model
prices generation (rates.py: a decode step reads the weights once, at plan.decode_efficiency of the bandwidth),
plus each sequence's KV cache and recurrent state:
- the target alone: each suite's first eval.timed_prompts one at a time (timed: the speedup's denominator), the
  rest in batches of eval.target_batch (the lossless check's reference tokens), a batch as long as its longest;
- the trained drafter, speculatively, every prompt one at a time (single-stream speedup, as the DFlash paper
  measures it): max_new_tokens / tau cycles, each a verify forward of the target (twice on a hybrid target: a
  partial acceptance restores the recurrent state and re-forwards the accepted tokens, target_cache.py) and one
  drafter forward (its layers and the LM head);
- with eval.num_draft_tokens auto, a full-block pass over the first suite to choose the draft length;
- the baseline drafter over its prompts of the first suite (untrained: tau 1).
Every prompt is priced at its suite's max_new_tokens (an upper bound: answers that stop early cost less), with tau
assumed (plan.eval_tau) until a run measures it. A CPU pool (no gpu_type) has no price and no refusal.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from flashdraft.components.plan.gpus import GpuSpec, gpu_spec
from flashdraft.components.plan.rates import decode_weight_bytes
from flashdraft.components.plan.resources import train_shape
from flashdraft.components.plan.sections import TargetSection
from flashdraft.config import RunConfig
from flashdraft.run import registry

STAGE = "evaluate"
# Tokens an eval prompt is assumed to hold (suites are chat questions: a few hundred tokens), for the KV reads.
PROMPT_TOKENS = 512
HOUR = 3600.0


class EvaluatePlan(BaseModel):
    """evaluate's price on its pool's GPU: hours by part, wall time against the stage's timeout."""

    model_config = ConfigDict(extra="forbid")

    gpu: str = Field(description="the evaluate pool's GPU")
    suites: int = Field(description="eval suites")
    prompts: int = Field(description="prompts over every suite (each suite's num_prompts)")
    decoded_tokens: int = Field(description="tokens decoded at most, every part (target alone, drafter, "
                                "draft-length pass, baseline)")
    single_stream_tokens_per_s: float = Field(description="the target alone, one prompt at a time (the model)")
    tau: float = Field(description="tokens a speculative cycle, assumed (plan.eval_tau)")
    target_batch: int = Field(description="eval.target_batch: prompts the target-alone reference decodes at once")
    hybrid_reforward: bool = Field(description="a partial acceptance re-forwards the accepted tokens (recurrent "
                                   "layers): two target forwards a cycle")
    hours: dict[str, float] = Field(description="wall hours by part")
    wall_hours: float = Field(description="the parts' sum: the stage's wall time")
    gpu_hours: float = Field(description="wall_hours x the pool's GPUs a pod")
    timeout_hours: float = Field(description="evaluate's timeout (the pod's activeDeadlineSeconds)")
    fits: bool = Field(description="wall_hours <= timeout_hours")
    rate_source: str = Field(description="where the decode rate comes from")


def _suite_work(cfg: RunConfig, num_prompts: int | None = None, max_new: int | None = None) -> list[tuple[int, int]]:
    """(prompts, max_new_tokens) per suite; `num_prompts`/`max_new` replace the eval-wide defaults (the levers)."""
    e = cfg.eval
    return [(s.num_prompts or num_prompts or e.num_prompts, s.max_new_tokens or max_new or e.max_new_tokens)
            for s in e.suites]


def _hybrid(section: TargetSection, cfg: RunConfig) -> bool:
    """Recurrent layers (Gated DeltaNet, Mamba): from the model's layer kinds, else (planning from hints) a
    per-sequence state that no sliding window explains."""
    if section.layer_types:
        return any("linear" in k or "mamba" in k for k in section.layer_types)
    return bool(cfg.plan.target_state_bytes_per_sequence) and not section.sliding_window


def _drafter_bytes(cfg: RunConfig) -> float:
    """bf16 bytes one drafter forward reads: its layers, fc, and the target's LM head it drafts through."""
    shape, _ = train_shape(cfg)
    H, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    layer = 2 * H * q + 2 * H * kv + 3 * H * shape.intermediate_size
    return 2 * (shape.num_layers * layer + shape.num_features * H * H + shape.vocab_size * H)


class _Pricer:
    """Step times on `gpu` for this target: a decode step of `batch` sequences at a mean context, a cycle."""

    def __init__(self, cfg: RunConfig, section: TargetSection, gpu: GpuSpec):
        self.cfg, self.section = cfg, section
        self.bandwidth = cfg.plan.decode_efficiency * gpu.bandwidth_gbs * 1e9
        self.hybrid = _hybrid(section, cfg)
        self.drafter_s = _drafter_bytes(cfg) / self.bandwidth

    def step_s(self, batch: int, max_new: int) -> float:
        """One decode step of `batch` sequences (bf16 weights: evaluate loads the target in target.dtype with HF)
        at the mean context of a `max_new`-token answer."""
        s, p = self.section, self.cfg.plan
        weights = decode_weight_bytes(s.params, s.active_params, s.experts, s.experts_per_token, batch)
        context = PROMPT_TOKENS + max_new / 2
        per_seq = (p.target_kv_bytes_per_token or 0) * context + (p.target_state_bytes_per_sequence or 0)
        return (weights + batch * per_seq) / self.bandwidth

    def speculative_s(self, prompts: int, max_new: int, tau: float) -> float:
        cycles = prompts * math.ceil(max_new / tau)
        return cycles * (self.step_s(1, max_new) * (2 if self.hybrid else 1) + self.drafter_s)


def baseline_prompts(cfg: RunConfig, first_suite_prompts: int) -> int:
    """Prompts the baseline decodes (components/evaluate/evaluate.py `run_evaluate`'s rule)."""
    limit = cfg.eval.baseline_prompts
    if cfg.evaluate_only or limit == 0:
        return 0
    if limit is None or cfg.drafter.init == "pretrained":
        return first_suite_prompts
    return min(limit, first_suite_prompts)


def evaluate_hours(cfg: RunConfig, pricer: _Pricer, work: list[tuple[int, int]]) -> dict[str, float]:
    """Wall hours of each part of evaluate for `work` (prompts, max_new_tokens per suite)."""
    e, tau = cfg.eval, cfg.plan.eval_tau
    batch = e.target_batch if e.temperature == 0 else 1  # sampling decodes one prompt at a time (evaluate.py)
    timed = [n if batch == 1 else min(e.timed_prompts, n) for n, _ in work]
    hours = {"target alone, one at a time (timed)": sum(t * m * pricer.step_s(1, m) for t, (_, m) in
                                                         zip(timed, work, strict=True)),
             "target alone, batched (reference)": sum(
                 _batched_s(pricer, n - t, m, batch) for t, (n, m) in zip(timed, work, strict=True)),
             "speculative (drafter)": sum(pricer.speculative_s(n, m, tau) for n, m in work)}
    first_n, first_m = work[0]
    if e.num_draft_tokens == "auto":
        hours["draft length (auto: full-block pass, first suite)"] = pricer.speculative_s(first_n, first_m, tau)
    base = baseline_prompts(cfg, first_n)
    if base:
        base_tau = tau if cfg.drafter.init == "pretrained" else 1.0
        hours["baseline drafter (first suite)"] = pricer.speculative_s(base, first_m, base_tau)
    return {k: round(v / HOUR, 2) for k, v in hours.items()}


def _batched_s(pricer: _Pricer, prompts: int, max_new: int, batch: int) -> float:
    full, rest = divmod(prompts, batch)
    return max_new * (full * pricer.step_s(batch, max_new) + (pricer.step_s(rest, max_new) if rest else 0.0))


def _decoded_tokens(cfg: RunConfig, work: list[tuple[int, int]]) -> int:
    first_n, first_m = work[0]
    extra = first_n if cfg.eval.num_draft_tokens == "auto" else 0
    return sum(2 * n * m for n, m in work) + (extra + baseline_prompts(cfg, first_n)) * first_m


def evaluate_plan(cfg: RunConfig, section: TargetSection) -> EvaluatePlan | None:
    """evaluate's price on its pool's GPU; None on a CPU pool (no GPU type: nothing to price)."""
    pool = registry.current().pool_config(cfg.pools, STAGE)
    if not pool.gpu_type:
        return None
    gpu = gpu_spec(pool.gpu_type, cfg.plan.gpu_overrides)
    pricer = _Pricer(cfg, section, gpu)
    work = _suite_work(cfg)
    hours = evaluate_hours(cfg, pricer, work)
    wall = round(sum(hours.values()), 2)
    timeout = registry.current().get(STAGE).timeout_s / HOUR
    return EvaluatePlan(
        gpu=gpu.name, suites=len(work), prompts=sum(n for n, _ in work), decoded_tokens=_decoded_tokens(cfg, work),
        single_stream_tokens_per_s=round(1 / pricer.step_s(1, cfg.eval.max_new_tokens), 1), tau=cfg.plan.eval_tau,
        target_batch=cfg.eval.target_batch, hybrid_reforward=pricer.hybrid, hours=hours, wall_hours=wall,
        gpu_hours=round(wall * max(1, pool.accelerator_count), 2), timeout_hours=round(timeout, 2),
        fits=wall <= timeout, rate_source=f"assumed (model): plan.decode_efficiency of {gpu.name}'s bandwidth")


def _largest_fitting(cfg: RunConfig, pricer: _Pricer, timeout_h: float, key: str, hi: int) -> int | None:
    """The largest eval-wide num_prompts or max_new_tokens (`key`) in [1, hi] that fits, or None."""
    def fits(value: int) -> bool:
        return sum(evaluate_hours(cfg, pricer, _suite_work(cfg, **{key: value})).values()) <= timeout_h

    if not fits(1):
        return None
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def evaluate_gate(cfg: RunConfig, section: TargetSection, plan: EvaluatePlan | None) -> str | None:
    """One line when the suites cannot finish inside evaluate's timeout: the hours, the largest parts, the
    levers (the eval-wide num_prompts or max_new_tokens that would fit); None when they fit or on a CPU pool."""
    if plan is None or plan.fits:
        return None
    pricer = _Pricer(cfg, section, gpu_spec(registry.current().pool_config(cfg.pools, STAGE).gpu_type,
                                            cfg.plan.gpu_overrides))
    e = cfg.eval
    prompts = _largest_fitting(cfg, pricer, plan.timeout_hours, "num_prompts", e.num_prompts)
    tokens = _largest_fitting(cfg, pricer, plan.timeout_hours, "max_new", e.max_new_tokens)
    parts = ", ".join(f"{k} {v:,.1f} h" for k, v in sorted(plan.hours.items(), key=lambda kv: -kv[1])[:3])
    levers = [f"eval.num_prompts (now {e.num_prompts}; " + (f"<= {prompts} fits)" if prompts else "no value fits "
                                                             "alone)"),
              f"eval.max_new_tokens (now {e.max_new_tokens}; " + (f"<= {tokens} fits)" if tokens else "no value "
                                                                  "fits alone)"),
              "fewer eval.suites (or a suite's own num_prompts / max_new_tokens)"]
    return (f"evaluate: {plan.suites} suites, {plan.prompts:,} prompts need {plan.wall_hours:,.1f} h on one "
            f"{plan.gpu} ({parts}; tau {plan.tau} assumed, plan.eval_tau), over evaluate's "
            f"{plan.timeout_hours:g} h timeout. Levers: " + "; ".join(levers))


def evaluate_lines(plan: EvaluatePlan | None) -> list[str]:
    """The plan's evaluate line under the stage table (Markdown)."""
    if plan is None:
        return []
    parts = ", ".join(f"{k} {v:,.2f} h" for k, v in plan.hours.items())
    verdict = "fits" if plan.fits else "**does not fit**"
    return [f"- evaluate: {plan.suites} suites, {plan.prompts:,} prompts, up to {plan.decoded_tokens:,} tokens "
            f"decoded on one {plan.gpu}: {plan.wall_hours:,.1f} h wall of its {plan.timeout_hours:g} h timeout "
            f"({verdict}; {parts}; tau {plan.tau} assumed, target alone {plan.single_stream_tokens_per_s} "
            f"tokens/s one at a time, batches of {plan.target_batch})"]


def evaluate_row(plan: EvaluatePlan | None) -> list[str]:
    """evaluate's row of the plan's stage table (tokens: decoded, both halves; rate: the target alone, one
    prompt at a time)."""
    if plan is None:
        return []
    return [f"| evaluate | {plan.gpu} | {plan.decoded_tokens:,} | {plan.single_stream_tokens_per_s} | "
            f"{plan.gpu_hours:,.1f} |"]
