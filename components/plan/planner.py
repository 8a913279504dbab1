"""`flashdraft plan`: the storage and throughput reality check, run before any GPU spins.

Arithmetic over the run config only: bytes per token for every codec, bytes at rest (offline) or the bounded
window (streaming), object counts, tokens to generate and extract, GPU-hours per stage on each pool, the bandwidth
streaming needs and the inference:trainer GPU ratio. Throughput models are deliberately simple and overridable
(`plan.measured_tokens_per_s`, or a calibration file): rates.py. Every topology priced in money and days beside
the configured one (`--compare`): compare.py.
Predicted peak memory per GPU and pool: resources.py, memory.py.

The gate (`run_plan`) refuses an offline run whose at-rest estimate exceeds storage.budget_bytes (naming a smaller
codec, streaming mode or fewer samples), any run whose predicted peak memory exceeds a pool's GPU (naming the
levers: docs/planning.md), any run whose planned cost or days exceed plan.max_cost_usd / plan.deadline_days
(naming cheaper or faster topologies: compare.py), and, in the pipeline's plan task, any hf: source or suite that
cannot be read as configured (naming the configs or splits that exist: hub_gate.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flashdraft.components.plan.compare import (
    RESPONSES_TRADE,
    Comparison,
    compare_topologies,
    cost_gate,
    summary_line,
    tokens_to_generate,
)
from flashdraft.components.plan.evaluate_plan import evaluate_gate, evaluate_lines, evaluate_plan, evaluate_row
from flashdraft.components.plan.fetch import fetch_plan
from flashdraft.components.plan.gpus import GpuSpec, gpu_spec
from flashdraft.components.plan.rates import TargetCost, stage_rates
from flashdraft.components.plan.resources import memory_gate, memory_section, train_shape, window_keys
from flashdraft.components.plan.sections import CodecPlan, StageEstimate, TargetSection
from flashdraft.components.plan.space import free_space, space_gate
from flashdraft.components.plan.summary import PlanSummary
from flashdraft.config import ConfigError, RunConfig
from flashdraft.config.codecs import CODECS, CodecParams, CodecSpecError
from flashdraft.perf.calibration import Calibration, load_calibration
from flashdraft.perf.flops import muon_step_flops, trainer_flops
from flashdraft.run import registry
from flashdraft.storage import layout
from flashdraft.target.model import Target, resolve_target

ID_BYTES_PER_TOKEN = 5  # int32 input id + uint8 loss mask stored beside the features


class PlanGateError(RuntimeError):
    """The run may not start: storage budget, a pool's memory, plan.max_cost_usd or plan.deadline_days."""


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e12:.1f} TB ({n / 2**40:.1f} TiB)" if n >= 1e12 else f"{n / 1e9:.2f} GB ({n / 2**30:.2f} GiB)"


def codec_for(cfg: RunConfig, name: str) -> CodecParams:
    """Codec `name` with the run's codec parameters (the ones that apply to it)."""
    f = cfg.features
    return CodecParams(name, fp8_scale=f.fp8_scale, zstd_level=f.zstd_level, q4_values=f.q4_values,
                       q4_block=f.q4_block, q4_scale=f.q4_scale, q4_outliers=f.q4_outliers, q4_rotate=f.q4_rotate)


def feature_bytes_per_token(cfg: RunConfig, codec: str, hidden: int) -> float:
    """Stored feature bytes per token for `codec` (without ids/mask), as the codec counts them; entropy-coded
    codecs scale their exact raw count by the measured `plan.zstd_ratio` (1.0 when none is known)."""
    params = codec_for(cfg, codec)
    ratio = cfg.plan.zstd_ratio.get(codec, 1.0) if params.spec.entropy_coded else None
    try:
        return params.bytes_per_token(hidden, cfg.features.num_features, ratio)
    except CodecSpecError as exc:
        raise ConfigError(f"features: {exc}") from None


def codec_cost(cfg: RunConfig, codec: str, hidden: int, tokens: float) -> CodecPlan:
    """One row of the plan's codec table. A codec that cannot hold rows of `hidden` values (q4 blocks that do not
    divide it) reads n/a with the reason instead of failing the plan: only the selected codec may refuse the run."""
    params = codec_for(cfg, codec)
    try:
        params.check_geometry(hidden)
    except CodecSpecError as exc:
        return CodecPlan(bytes_per_token=None, total_bytes=None, total_tb=None, total_tib=None,
                         lossless=params.lossless, unavailable=str(exc))
    bpt = feature_bytes_per_token(cfg, codec, hidden)
    total = tokens * (bpt + ID_BYTES_PER_TOKEN)
    return CodecPlan(bytes_per_token=round(bpt, 1), total_bytes=int(total), total_tb=round(total / 1e12, 2),
                     total_tib=round(total / 2**40, 2), lossless=params.lossless, unavailable=None)


def planning_target(cfg: RunConfig) -> tuple[RunConfig, Target, TargetSection]:
    """The target resolved once (its own config where its files are here, else the config's hints), the config
    with every target figure the planner reads filled in from it, and the plan's `target` section: each figure
    and where it came from. Explicit plan.target_* values win (a contradicting one was refused by the resolver)."""
    target = resolve_target(cfg, hints=True)
    geo, p = target.geometry, cfg.plan
    params = p.target_params or geo.params
    sources = dict(target.sources)
    if p.target_params:
        sources["params"] = "plan.target_params"
    vocab = p.target_vocab or geo.vocab_size
    if p.target_vocab:
        sources["vocab_size"] = "plan.target_vocab"
    kv = p.target_kv_bytes_per_token or geo.kv_bytes_per_token()
    state = p.target_state_bytes_per_sequence
    if state is None:
        state = geo.state_bytes_per_sequence() if target.from_files else 0.0
    filled = cfg.with_overrides({
        "target.num_layers": geo.num_layers, "target.hidden_size": geo.hidden_size, "plan.target_vocab": vocab,
        "plan.target_params": params, "plan.target_kv_bytes_per_token": kv,
        "plan.target_state_bytes_per_sequence": state,
        "plan.target_intermediate_size": p.target_intermediate_size or geo.intermediate_size})
    section = TargetSection(
        model=cfg.target.model, num_layers=geo.num_layers, hidden_size=geo.hidden_size, vocab_size=vocab,
        params=params, active_params=geo.active_params or params, layer_types=_layer_kinds(geo),
        sliding_window=geo.sliding_window, attention_sinks=geo.attention_sinks, experts=geo.num_experts,
        experts_per_token=geo.experts_per_token, from_model_files=target.from_files, sources=sources,
        hinted=[k for k, v in sources.items() if v != "model config"])
    return filled, target, section


def _layer_kinds(geo) -> dict[str, int] | None:
    if geo.layer_types is None:
        return None
    return {k: list(geo.layer_types).count(k) for k in dict.fromkeys(geo.layer_types)}


def _pool_gpu(cfg: RunConfig, stage: str) -> GpuSpec | None:
    pool = registry.current().pool_config(cfg.pools, stage)
    return gpu_spec(pool.gpu_type, cfg.plan.gpu_overrides) if pool.gpu_type else None


def planned_samples(cfg: RunConfig) -> tuple[int, int]:
    """(samples, tokens per sample) the run generates and extracts. data.max_samples counts the held-out eval
    prompts too, which are never generated or extracted; and no sample is longer than the prompt and response
    limits."""
    d = cfg.data
    if d.expected_samples is None and d.max_samples is None:
        raise ConfigError("plan needs data.expected_samples (or data.max_samples)")
    samples = d.expected_samples or max(1, d.max_samples - d.eval_count)
    return samples, min(d.expected_tokens_per_sample, d.max_prompt_tokens + d.max_response_tokens)


def codec_table(cfg: RunConfig, hidden: int, tokens: int) -> dict[str, CodecPlan]:
    """Every codec's cost; refuses a selected codec that cannot hold the target's rows, naming those that can."""
    codecs = {codec: codec_cost(cfg, codec, hidden, tokens) for codec in CODECS}
    selected = codecs[cfg.features.codec]
    if selected.unavailable:
        usable = ", ".join(c for c, v in codecs.items() if not v.unavailable)
        raise ConfigError(f"features.codec={cfg.features.codec}: {selected.unavailable} (codecs that hold it: "
                          f"{usable or 'none'})")
    return codecs


@dataclass(frozen=True)
class Throughput:
    """The planned work per GPU stage and what it implies for streaming (make_plan's throughput half)."""

    cost: TargetCost
    gpus: dict[str, GpuSpec | None]  # generate, extract, train
    step_flops: dict[str, float]  # one rank's training step FLOPs by part
    train_flops_per_token: float
    calibration: Calibration | None
    gpu_hours: dict[str, StageEstimate]
    streaming_bandwidth: float | None  # store bytes/s the trainers consume in streaming mode
    inference_per_trainer_gpu: float | None


def throughput(cfg: RunConfig, target: Target, section: TargetSection, tokens: int, stored_bytes_per_token: float
               ) -> Throughput:
    """Rates and GPU-hours per stage on each pool's GPU, the bandwidth streaming needs and the extract:train GPU
    ratio that keeps the window fed (rates.py: measured, calibrated or modelled)."""
    geo = target.geometry
    ids = cfg.layer_ids(geo.num_layers)
    cost = TargetCost(params=section.params, active=section.active_params, num_experts=geo.num_experts,
                      experts_per_token=geo.experts_per_token,
                      extract_flops_per_token=2 * section.active_params * (max(ids) + 1) / geo.num_layers)
    gpus = {stage: _pool_gpu(cfg, stage) for stage in ("generate", "extract", "train")}
    inf_gpu, train_gpu = gpus["generate"], gpus["train"]
    shape, _ = train_shape(cfg)
    step_flops = trainer_flops(shape, window_keys(cfg))
    if shape.optimizer == "muon":  # its Newton-Schulz runs once an optimizer step, not once a row
        step_flops["Muon Newton-Schulz"] = muon_step_flops(shape) / cfg.training.grad_accum
    train_flops_per_token = sum(step_flops.values()) / shape.tokens_per_step
    cal = load_calibration(cfg.plan.calibration) if cfg.plan.calibration else None
    found = stage_rates(cfg, cost, inf_gpu, train_gpu, train_flops_per_token, cal, cfg.plan.target_precision)
    rates = found.tokens_per_s
    stage_tokens = {"generate": tokens_to_generate(cfg, tokens), "extract": tokens,  # none: data.responses=dataset
                    "train": tokens * cfg.training.epochs}
    gpu_of = {"generate": inf_gpu, "extract": inf_gpu, "train": train_gpu}  # extract priced on generate's GPU
    gpu_hours = {stage: StageEstimate(
        gpu=gpu_of[stage].name if gpu_of[stage] else None, tokens=n, tokens_per_s_per_gpu=_r(rates[stage]),
        gpu_hours=round(n / rates[stage] / 3600, 1) if rates[stage] else None, rate_source=found.sources[stage])
        for stage, n in stage_tokens.items()}
    stream_bw = ratio = None
    if rates["train"]:
        stream_bw = rates["train"] * cfg.training.world_size * stored_bytes_per_token / cfg.mode.reuse
        if rates["extract"]:
            # Streaming: producers must extract what trainers consume (each shard is trained on `reuse` times).
            ratio = round(rates["train"] / (cfg.mode.reuse * rates["extract"]), 2)
    return Throughput(cost, gpus, step_flops, train_flops_per_token, cal, gpu_hours, stream_bw, ratio)


def with_variants(gpu_hours: dict[str, StageEstimate], variants: int) -> dict[str, StageEstimate]:
    """The stages' work with `plan.train_variants` trainings of the same features: generate and extract once, train
    N times (what a sweep runs; `plan --compare` prices the same per topology)."""
    one = gpu_hours["train"]
    trains = one.model_copy(update={"tokens": one.tokens * variants,
                                    "gpu_hours": None if one.gpu_hours is None else round(one.gpu_hours * variants, 1)})
    return {**gpu_hours, "train": trains}


def make_plan(cfg: RunConfig, origin: str | None = None) -> PlanSummary:
    """The whole estimate, typed (the `--json` output and metrics/plan.json), its gate included. `origin`: the
    command line's --preset / --config / --set options, repeated in the evaluate-only command it prints."""
    cfg, target, section = planning_target(cfg)
    layers, hidden = target.geometry.num_layers, target.geometry.hidden_size
    samples, tps = planned_samples(cfg)
    tokens = samples * tps
    codecs = codec_table(cfg, hidden, tokens)
    selected = codecs[cfg.features.codec]
    at_rest = selected.total_bytes
    window = min(cfg.mode.window_bytes, at_rest)
    shard_count = math.ceil(at_rest / cfg.features.shard_bytes)
    work = throughput(cfg, target, section, tokens, selected.bytes_per_token + ID_BYTES_PER_TOKEN)
    budget = cfg.storage.budget_bytes
    fits = budget is None or at_rest <= budget
    plan = PlanSummary(
        target=cfg.target.model, layer_ids=cfg.layer_ids(layers), num_layers=layers, hidden_size=hidden,
        target_geometry=section, samples=samples, tokens_per_sample=tps, total_tokens=tokens,
        bytes_per_token=int(cfg.features.num_features * hidden * 2),  # the naive bf16 reference layout
        codecs=codecs, codec=cfg.features.codec, total_bytes_at_rest=at_rest, peak_bytes_streaming=int(window),
        objects=2 * shard_count + 1, shards=shard_count, tokens_to_generate=work.gpu_hours["generate"].tokens,
        responses=cfg.data.responses,
        tokens_to_extract=tokens, gpu_hours=with_variants(work.gpu_hours, cfg.plan.train_variants),
        train_variants=cfg.plan.train_variants,
        streaming_bandwidth_bytes_per_s=_r(work.streaming_bandwidth),
        inference_per_trainer_gpu=work.inference_per_trainer_gpu, trainer_gpus=cfg.training.world_size,
        mode=cfg.mode.kind,
        recommended_mode="offline" if fits else ("streaming" if window <= (budget or 0) else "none fits"),
        budget_bytes=budget, fits_budget=fits, memory=memory_section(cfg, work.cost.params, work.gpus,
                                                                     work.calibration),
        train_flops_per_step={k: float(f"{v:.4g}") for k, v in work.step_flops.items()},
        calibration=work.calibration.origin() if work.calibration else None,
        target_fetch=fetch_plan(cfg, work.cost.params))
    evaluate = evaluate_plan(cfg, section)
    if evaluate is not None:  # a CPU pool: no key, so a CPU run's metrics/plan.json keeps its bytes
        plan.evaluate = evaluate
    if cfg.evaluate_only:  # no features are stored and nothing trains: no topology to price
        plan.evaluate_only, plan.comparison = True, None
    else:
        plan.comparison = compare_topologies(cfg, plan.memory, plan.codecs, work.gpu_hours, work.cost,
                                             work.train_flops_per_token, work.calibration)
    plan.free_alternatives = free_alternatives(cfg, target.geometry.model_type, origin)
    plan.gate = plan_gate(cfg, plan, work.gpus)
    return plan


MTP_FAMILIES = ("qwen3_5", "qwen3_next", "qwen3.5", "qwen3.6", "qwen3-next")  # their checkpoints ship mtp.* weights


def free_alternatives(cfg: RunConfig, model_type: str, origin: str | None = None) -> list[str]:
    """Does training pay? What costs nothing to try, and the evaluate-only command that measures it beside the
    published drafter on this run's own prompts (evaluate's eval.baselines; docs/evaluation.md)."""
    family = f"{model_type} {cfg.target.model}".lower()
    mtp = ("the target's own MTP head (Qwen3.5/3.6 checkpoints ship `mtp.*` weights; vLLM `{\"method\": \"mtp\"}`)"
           if any(f in family for f in MTP_FAMILIES) else
           "the target's MTP head where its checkpoint ships `mtp.*` weights (evaluate says if it does not)")
    published = cfg.drafter.init_from or "hf:<a published drafter for this target>"
    command = (f"flashdraft run-local {origin or '--preset <yours>'} --set drafter.init=pretrained "
               f"--set drafter.init_from={published} --set drafter.kind=dflash --set training.max_steps=0")
    if cfg.evaluate_only:
        return [f"Evaluate only: prompt lookup (vLLM `{{\"method\": \"ngram\"}}`) and {mtp} are decoded beside "
                "the published drafter; the report ends with which to serve."]
    return [f"Before paying for training: prompt lookup (vLLM `{{\"method\": \"ngram\"}}`) and {mtp} cost "
            "nothing to try, and a published drafter only its evaluation. Measure them on your prompts first "
            "(no generate, extract or train; the report ends with which to serve per suite):",
            "", "```bash", command, "```"]


def plan_gate(cfg: RunConfig, plan: PlanSummary, gpus: dict[str, GpuSpec | None]) -> str | None:
    """Why the run may not start (storage budget, free space, memory, cost or days, evaluate's timeout, joined by
    " | "); None when it may. An evaluate-only run stores no features and trains nothing: only the inference pool's
    memory and evaluate's timeout can refuse it."""
    if cfg.evaluate_only:
        gates = [memory_gate(cfg, {p: m for p, m in plan.memory.items() if m["stage"] != "train"}, gpus)]
    else:
        gates = [gate_message(cfg, plan), free_space_message(cfg, plan), memory_gate(cfg, plan.memory, gpus),
                 cost_gate(plan.comparison, cfg)]
    gates.append(evaluate_gate(cfg, plan.target_geometry, plan.evaluate))
    return " | ".join(g for g in gates if g) or None


def free_space_message(cfg: RunConfig, plan: PlanSummary) -> str | None:
    """A `file://` store on a filesystem too small for what the run will hold at once (space.py): offline, the
    selected codec's bytes at rest; streaming, the window."""
    if plan.mode == "offline":
        return space_gate(plan.total_bytes_at_rest, free_space(cfg), f"at rest with codec {plan.codec}")
    return space_gate(plan.peak_bytes_streaming, free_space(cfg), "for the streaming window (mode.window_bytes)")


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def gate_message(cfg: RunConfig, plan: PlanSummary) -> str | None:
    """Why an offline run may not start, with the alternatives that would fit; None when it may."""
    budget = plan.budget_bytes
    if plan.mode != "offline" or plan.fits_budget:
        return None
    alternatives = []
    fitting = [c for c, v in plan.codecs.items() if not v.unavailable and v.total_bytes <= budget]
    if fitting:
        alternatives.append("a smaller codec: " + ", ".join(
            f"{c} ({_fmt_bytes(plan.codecs[c].total_bytes)})" for c in fitting))
    alternatives.append(f"streaming mode (peak {_fmt_bytes(min(cfg.mode.window_bytes, budget))} with "
                        f"mode.window_bytes <= budget)")
    per_sample = plan.total_bytes_at_rest / plan.samples
    alternatives.append(f"fewer samples: at most {int(budget // per_sample):,} fit with {plan.codec}")
    return (f"offline run needs {_fmt_bytes(plan.total_bytes_at_rest)} at rest with codec {plan.codec}, "
            f"over storage.budget_bytes = {_fmt_bytes(budget)}. Alternatives: " + "; ".join(alternatives))


def plan_markdown(plan: PlanSummary) -> str:
    """The plan as a Markdown table (a KFP Markdown artifact and the report's planner section)."""
    lines = [f"### Plan: {plan.target} ({plan.samples:,} samples x {plan.tokens_per_sample} tokens)", "",
             f"Feature layers {plan.layer_ids}, naive bf16 layout {plan.bytes_per_token:,} B/token.", "",
             *target_lines(plan), "",
             "| codec | lossless | bytes/token | x bf16 | at rest |", "|---|---|---:|---:|---:|"]
    for codec, v in plan.codecs.items():
        mark = " (selected)" if codec == plan.codec else ""
        if v.unavailable:
            lines.append(f"| {codec}{mark} | {'yes' if v.lossless else 'no'} | n/a ({v.unavailable}) | - | - |")
            continue
        lines.append(f"| {codec}{mark} | {'yes' if v.lossless else 'no'} | {v.bytes_per_token:,.0f} | "
                     f"{v.bytes_per_token / plan.bytes_per_token:.3f} | {_fmt_bytes(v.total_bytes)} |")
    lines += ["", "| stage | GPU | tokens | tokens/s/GPU | GPU-hours |", "|---|---|---:|---:|---:|"]
    for stage, v in plan.gpu_hours.items():
        if stage == "train" and plan.train_variants > 1:
            stage = f"train ({plan.train_variants} variants, plan.train_variants)"
        lines.append(f"| {stage} | {v.gpu or '-'} | {v.tokens:,} | {v.tokens_per_s_per_gpu or '-'} | "
                     f"{v.gpu_hours if v.gpu_hours is not None else '-'} |")
    lines += evaluate_row(plan.evaluate)
    bw, ratio = plan.streaming_bandwidth_bytes_per_s, plan.inference_per_trainer_gpu
    unknown = "- (no GPU rate: a pool without pools.*.gpu_type)"  # CPU presets: never "None" in the table
    lines += ["", f"- mode: **{plan.mode}** (recommended: {plan.recommended_mode}); objects: {plan.objects:,}",
              f"- streaming peak: {_fmt_bytes(plan.peak_bytes_streaming)}; bandwidth needed: "
              f"{f'{bw / 1e9:.2f} GB/s' if bw is not None else unknown}",
              f"- inference GPUs per trainer GPU (streaming, to keep up): {ratio if ratio is not None else unknown}",
              *evaluate_lines(plan.evaluate)]
    lines += memory_markdown(plan)
    lines += [f"- {plan.target_fetch.line()}"] if plan.target_fetch else []
    lines += [f"- {RESPONSES_TRADE}"] if plan.responses == "dataset" else []
    line = summary_line(plan.comparison)
    if line:
        lines += ["", f"- {line}"]
    lines += hub_markdown(plan)
    if plan.free_alternatives:
        lines += ["", *plan.free_alternatives]
    if plan.gate:
        lines += ["", f"**Gate: {plan.gate}**"]
    return "\n".join(lines) + "\n"


def hub_markdown(plan: PlanSummary) -> list[str]:
    """The hf: datasets as the plan task found them (commit, config, rows per split)."""
    if not plan.hub_datasets:
        return []
    lines = ["", "| hf: dataset | entry | config | commit | rows per split |", "|---|---|---|---|---|"]
    for d in plan.hub_datasets:
        rows = ", ".join(f"{s} {'?' if n is None else f'{n:,}'}" for s, n in (d.get("rows") or {}).items())
        lines.append(f"| {d['uri']} | {d['entry']} | {d.get('config') or '-'} | {(d.get('commit') or '-')[:12]} | "
                     f"{rows or '-'} |")
    return lines


def comparison_of(plan: PlanSummary) -> Comparison | None:
    """The plan's topology comparison (None for a CPU run)."""
    return plan.comparison


def target_lines(plan: PlanSummary) -> list[str]:
    """What the plan took the target to be, and which figures did not come from the model's own config."""
    t = plan.target_geometry
    if t is None:
        return []
    line = (f"Target: {t.num_layers} layers x {t.hidden_size}, vocabulary {t.vocab_size:,}, "
            f"{t.params / 1e9:,.2f}B parameters")
    if t.active_params < t.params:
        routed = f", {t.experts_per_token} of {t.experts} experts a token" if t.experts else ""
        line += (f" ({t.active_params / 1e9:,.2f}B active: MoE{routed}; every expert resident on the inference "
                 "GPUs, the active parameters for FLOPs)")
    if t.layer_types:
        line += "; layers " + ", ".join(f"{v} {k}" for k, v in t.layer_types.items())
    if t.sliding_window:
        line += f", window {t.sliding_window}"
    if t.attention_sinks:
        line += ", attention sinks"
    out = [line + "."]
    if t.hinted:
        out += ["", "Not from the model's config (its files are not on this machine): " + "; ".join(
            f"{k} from {t.sources[k]}" for k in t.hinted) + "."]
    return out


def memory_markdown(plan: PlanSummary) -> list[str]:
    """Per pool: predicted peak, the GPU's usable memory, fits; the training FLOPs; where each figure comes from."""
    lines = ["", "| pool | stages | GPU | predicted peak / GPU | usable / GPU | fits | peak set by |",
             "|---|---|---|---:|---:|---|---|"]
    for pool, m in plan.memory.items():
        usable = _gib(m["usable_bytes_per_gpu"]) if m["usable_bytes_per_gpu"] else "-"
        fits = "-" if m["fits"] is None else ("yes" if m["fits"] else "**no**")
        lines.append(f"| {pool} | {m['stage']} | {m['gpu'] or '-'} | {_gib(m['peak_bytes_per_gpu'])} | {usable} | "
                     f"{fits} | {m['phase']} |")
    for pool, m in plan.memory.items():
        top = sorted(m["parts"].items(), key=lambda kv: -kv[1])[:4]
        lines.append(f"- {pool}: " + ", ".join(f"{k} {_gib(v)}" for k, v in top) + f" ({m['peak_source']})")
    train = plan.memory.get(next((p for p, m in plan.memory.items() if m["stage"] == "train"), ""), {})
    state = {k: v for k, v in train.get("parts", {}).items() if "moments" in k or "momentum" in k}
    if state:
        lines.append("- optimizer state per trainer GPU (training.optimizer): "
                     + ", ".join(f"{k} {_gib(v)}" for k, v in state.items()))
    if train.get("assumed"):
        lines.append(f"- assumed drafter geometry (not in the config): {', '.join(train['assumed'])}")
    flops = plan.train_flops_per_step
    total = sum(flops.values()) or 1
    lines.append("- training FLOPs a step (per rank): " + ", ".join(
        f"{k} {v / 1e12:,.1f} TFLOP ({v / total:.0%})" for k, v in flops.items()))
    lines.append("- rates: " + "; ".join(f"{stage}: {v.rate_source}" for stage, v in plan.gpu_hours.items()))
    if plan.calibration:
        lines.append(f"- calibration: {plan.calibration}")
    return lines


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def run_plan(cfg: RunConfig, open_sources: bool = False) -> PlanSummary:
    """Pipeline gate: compute the plan, store it as metrics/plan.json, refuse a run that may not start (before
    any other task). open_sources: also open every hf: dataset the run reads (hub_gate.py), as the plan task does
    (Plan.run); the plan's own arithmetic needs no network."""
    from flashdraft.components.plan.hub_gate import hub_gate
    from flashdraft.storage.store import open_store

    plan = make_plan(cfg)
    if open_sources:
        plan.hub_datasets, refused = hub_gate(cfg)
        plan.gate = " | ".join(g for g in (plan.gate, refused) if g) or None
    open_store(cfg.storage, cfg.run_id).commit_json(layout.metrics_key("plan"), plan.dump())
    if plan.gate:
        raise PlanGateError(plan.gate)
    return plan
