"""The plan's resource section: the run config turned into memory.py's shapes, per-pool peaks with fits, FLOPs a
training step by part, the memory gate's levers, and calibration (measured figures replacing assumed ones).

Shape from the config alone: a packed row holds `training.tokens_per_step` context tokens (the per-rank budget)
from `tokens_per_step // data.expected_tokens_per_sample` samples; each sample's response is
`plan.response_fraction` of it and draws `min(drafter.max_anchors, response - block)` anchors. Drafter geometry
unset in the config (it defaults to the target's, which `plan` does not download) is assumed (128-wide heads, MHA,
MLP 3x width) and listed as assumed in the plan.

Calibration precedence (`plan.measured_tokens_per_s` > calibration file > model) and how a measured rate or
memory factor carries to another shape or GPU: docs/planning.md, "Calibration files".
"""

from __future__ import annotations

import functools
import math
from typing import Any

from flashdraft.components.plan.gpus import GPUS, GpuSpec
from flashdraft.components.plan.memory import (
    WEIGHT_BYTES,
    InferenceShape,
    MemoryEstimate,
    fmt_gib,
    inference_memory,
    trainer_memory,
)
from flashdraft.config import RunConfig
from flashdraft.perf.calibration import Calibration, TrainShape
from flashdraft.run import registry
from flashdraft.target.model import DEFAULT_VOCAB

VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of the GPU; the generate stage does not change it


def train_shape(cfg: RunConfig, **changes: Any) -> tuple[TrainShape, list[str]]:
    """The per-rank trainer step the config implies, and the names of the fields that were assumed.
    `changes` override config values (the gate's lever search): tokens_per_step, max_anchors, vocab_size,
    strategy, world_size, activation_checkpointing, selector_top_k, selector_detach."""
    d, t = cfg.drafter, cfg.training
    H = d.hidden_size or cfg.target.hidden_size
    assumed = []
    heads = d.num_heads
    if heads is None:
        heads = max(1, H // 128)
        assumed.append("drafter.num_heads")
    head_dim = d.head_dim or H // heads
    kv = d.num_kv_heads
    if kv is None:
        kv = heads
        assumed.append("drafter.num_kv_heads")
    inter = d.intermediate_size
    if inter is None:
        inter = 3 * H
        assumed.append("drafter.intermediate_size")
    tokens = changes.get("tokens_per_step", t.tokens_per_step)
    max_anchors = changes.get("max_anchors", d.max_anchors)
    tps = cfg.data.expected_tokens_per_sample
    per_row = max(1, tokens // tps)
    per_sample = min(max_anchors, max(0, int(min(tps, tokens) * cfg.plan.response_fraction) - d.block_size))
    windows = {w for w in [d.sliding_window] if "sliding_attention" in d.resolved_layer_types()}
    target_vocab = cfg.plan.target_vocab or cfg.target.vocab_size or DEFAULT_VOCAB  # planner.py fills it in
    vocab = changes.get("vocab_size", d.draft_vocab_size or target_vocab)
    strategy = changes.get("strategy", t.strategy)
    world = changes.get("world_size", t.world_size)
    shape = TrainShape(
        hidden_size=H, num_layers=d.num_layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=inter, vocab_size=min(vocab, target_vocab), target_vocab_size=target_vocab,
        num_features=cfg.features.num_features, block_size=d.block_size, max_anchors=max_anchors,
        tokens_per_step=tokens, anchors_per_row=per_row * per_sample, sliding_window=min(windows) if windows else None,
        strategy=strategy if world > 1 else "none", world_size=world,
        activation_checkpointing=changes.get("activation_checkpointing", t.activation_checkpointing),
        kind=d.kind, conv_kernel_size=d.conv_kernel_size, conv_group_size=d.conv_group_size,
        selector_rank=d.selector_rank, selector_top_k=changes.get("selector_top_k", d.selector_top_k),
        selector_detach=changes.get("selector_detach", d.selector_detach), optimizer=t.optimizer)
    return shape, assumed


def window_keys(cfg: RunConfig) -> float:
    """Mean context keys a drafted position sees: anchors fall uniformly over the response, so the mean anchor sits
    at (1 - response_fraction / 2) of a sample; a sliding window caps it."""
    mean_pos = cfg.data.expected_tokens_per_sample * (1 - cfg.plan.response_fraction / 2)
    w = cfg.drafter.sliding_window if "sliding_attention" in cfg.drafter.resolved_layer_types() else None
    return min(mean_pos, w) if w else mean_pos


def inference_shape(cfg: RunConfig, params: float, weight_bytes_per_param: float = 2) -> InferenceShape:
    H, L = cfg.target.hidden_size, cfg.target.num_layers
    p = cfg.plan
    return InferenceShape(
        target_params=params, hidden_size=H, intermediate_size=p.target_intermediate_size or 4 * H,
        tensor_parallel=cfg.generation.tensor_parallel,
        kv_bytes_per_token=p.target_kv_bytes_per_token or 4 * L * H,
        state_bytes_per_sequence=p.target_state_bytes_per_sequence or 0.0, batch=p.decode_batch,
        max_model_len=cfg.generation.max_model_len or cfg.data.max_prompt_tokens + cfg.data.max_response_tokens,
        prefill_tokens=cfg.features.batch_tokens, num_features=cfg.features.num_features,
        vocab_size=p.target_vocab or cfg.target.vocab_size or DEFAULT_VOCAB,
        gpu_memory_utilization=VLLM_GPU_MEMORY_UTILIZATION, weight_bytes_per_param=weight_bytes_per_param)


def memory_factor(cal: Calibration | None, shape: TrainShape) -> tuple[float, str] | None:
    """(measured / predicted trainer peak, where) at the calibration's measured shape nearest to `shape`: the same
    width, depth and recompute mode when measured, then the nearest predicted peak. None without a usable one."""
    if cal is None:
        return None
    plan_peak = trainer_memory(shape, "cuda").peak_bytes
    usable = [m for m in cal.train_memory
              if not m.out_of_memory and m.shape.anchors_per_row is not None and m.measure != "rss_delta"]
    if not usable:
        return None

    def distance(m) -> tuple[bool, float]:
        same = ((m.shape.kind, m.shape.hidden_size, m.shape.num_layers, m.shape.activation_checkpointing)
                == (shape.kind, shape.hidden_size, shape.num_layers, shape.activation_checkpointing))
        return not same, abs(math.log(trainer_memory(m.shape, "cuda").peak_bytes / plan_peak))

    m = min(usable, key=distance)
    factor = m.peak_bytes / trainer_memory(m.shape, "cuda").peak_bytes
    kind = "dflash2 " if m.shape.kind == "dflash2" else ""
    return factor, (f"{fmt_gib(m.peak_bytes)} measured at {kind}{m.shape.num_layers} x {m.shape.hidden_size}, "
                    f"{m.shape.max_anchors} anchors a sample, {m.shape.tokens_per_step:,} tokens a step")


def pool_entry(estimate: MemoryEstimate, gpu: GpuSpec | None, budget_share: float, factor=None) -> dict[str, Any]:
    peak = estimate.peak_bytes * (factor[0] if factor else 1.0)
    usable = int(gpu.usable_bytes * budget_share) if gpu else None
    entry = {"gpu": gpu.name if gpu else None, "peak_bytes_per_gpu": int(peak), "usable_bytes_per_gpu": usable,
             "fits": None if usable is None else peak <= usable, "phase": estimate.phase,
             "parts": {k: int(v) for k, v in estimate.parts.items()},
             "loss_chunk_bytes": estimate.loss_chunk_bytes, "peak_source": "assumed (components/plan/memory.py)"}
    if factor:
        entry["measured_factor"] = round(factor[0], 3)
        entry["peak_source"] = f"model x {factor[0]:.2f}: {factor[1]}"
    return entry


def memory_section(cfg: RunConfig, params: float, gpus: dict[str, GpuSpec | None],
                   cal: Calibration | None) -> dict[str, dict[str, Any]]:
    """Per pool (by name): predicted peak per GPU, the usable memory and whether it fits."""
    pool_of = functools.partial(registry.current().pool_name, cfg.pools)
    out: dict[str, dict[str, Any]] = {}
    shape, assumed = train_shape(cfg)
    train = pool_entry(trainer_memory(shape, "cuda"), gpus.get("train"), 1.0, memory_factor(cal, shape))
    train.update(stage="train", anchors_per_row=shape.anchors_per_row, assumed=assumed)
    out[pool_of("train")] = train
    inf = inference_memory(inference_shape(cfg, params, WEIGHT_BYTES[cfg.plan.target_precision]))
    for stage in ("generate", "extract"):
        pool = pool_of(stage)
        if pool in out:
            continue
        # vLLM takes its share up front; extraction (HF) may use it all: check against the stricter.
        share = VLLM_GPU_MEMORY_UTILIZATION if inf.phase.startswith("generation") else 1.0
        out[pool] = {**pool_entry(inf, gpus.get(stage), share), "stage": "generate, extract"}
    return out


def _fits(cfg: RunConfig, gpu: GpuSpec, factor: float, **changes: Any) -> bool:
    shape, _ = train_shape(cfg, **changes)
    return trainer_memory(shape, "cuda").peak_bytes * factor <= gpu.usable_bytes


def _largest(cfg: RunConfig, gpu: GpuSpec, factor: float, key: str, hi: int, lo: int = 1) -> int | None:
    """The largest value of `key` in [lo, hi] that fits (the peak grows with it), or None."""
    if not _fits(cfg, gpu, factor, **{key: lo}):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _fits(cfg, gpu, factor, **{key: mid}) else (lo, mid - 1)
    return lo


def memory_gate(cfg: RunConfig, memory: dict[str, dict[str, Any]], gpus: dict[str, GpuSpec | None]) -> str | None:
    """Why a pool would run out of memory, with the levers that would make it fit; None when every pool fits."""
    msgs = []
    for pool, entry in memory.items():
        if entry["fits"] is not False:
            continue
        head = (f"pool {pool} ({entry['stage']}): predicted peak {fmt_gib(entry['peak_bytes_per_gpu'])} per GPU over "
                f"the usable {fmt_gib(entry['usable_bytes_per_gpu'])} of {entry['gpu']} (largest: " + ", ".join(
                    f"{k} {fmt_gib(v)}" for k, v in sorted(entry["parts"].items(), key=lambda kv: -kv[1])[:3]) + ")")
        if entry["stage"] == "train":
            msgs.append(head + ". Levers: " + "; ".join(_train_levers(cfg, gpus["train"], entry)))
        else:
            msgs.append(head + ". Levers: plan.decode_batch / generation.max_model_len (KV cache and recurrent "
                        "state), generation.tensor_parallel (splits weights and cache), features.batch_tokens "
                        "(extraction's prefill)")
    return " | ".join(msgs) if msgs else None


def _train_levers(cfg: RunConfig, gpu: GpuSpec, entry: dict[str, Any]) -> list[str]:
    d, t = cfg.drafter, cfg.training
    factor = entry.get("measured_factor", 1.0)
    levers = []
    tokens = _largest(cfg, gpu, factor, "tokens_per_step", t.tokens_per_step, lo=16)
    levers.append(f"training.tokens_per_step (now {t.tokens_per_step:,}; "
                  + (f"<= {tokens:,} fits)" if tokens else "no value fits alone)"))
    anchors = _largest(cfg, gpu, factor, "max_anchors", d.max_anchors)
    levers.append(f"drafter.max_anchors (now {d.max_anchors}, {entry['anchors_per_row']:,.0f} anchors a row; "
                  + (f"<= {anchors} fits)" if anchors else "no value fits alone)"))
    # A draft vocabulary cuts the LM head's FLOPs, not memory: the trainer keeps the full head (and embedding)
    # resident and gathers the draft rows beside it, and the loss's chunk is a fixed number of logits.
    if d.kind != "dflash2":  # dflash2 needs the full vocabulary (config/drafter.py)
        levers.append(f"drafter.draft_vocab_size (now {d.draft_vocab_size or 'the full vocabulary'}): cuts the LM "
                      "head's share of the step's FLOPs, not memory (the full head stays resident)")
    for mode in ("mlp", "layer")[("none", "mlp", "layer").index(t.activation_checkpointing):]:
        ok = _fits(cfg, gpu, factor, activation_checkpointing=mode)
        levers.append(f"training.activation_checkpointing={mode} (recomputes in the backward; "
                      f"{'fits' if ok else 'not enough alone'})")
    if t.strategy != "fsdp2" or t.world_size == 1:
        sharded = _fits(cfg, gpu, factor, strategy="fsdp2", world_size=max(t.world_size, 2))
        levers.append(f"training.strategy=fsdp2 over training.nproc_per_node x num_nodes (shards weights, "
                      f"gradients and optimizer state; {'fits' if sharded else 'not enough alone'})")
    if d.kind == "dflash2":
        # the selector loss keeps the LM head's rows of every slot's top-k candidates, [slots, k, width], for its
        # backward (memory.py `selector_saved_bytes`); detached it keeps none (and stops training the drafter)
        top_k = _largest(cfg, gpu, factor, "selector_top_k", d.selector_top_k, lo=2)
        levers.append(f"drafter.selector_top_k (now {d.selector_top_k}; "
                      + (f"<= {top_k} fits)" if top_k else "no value fits alone)"))
        if not d.selector_detach:
            ok = _fits(cfg, gpu, factor, selector_detach=True)
            levers.append("drafter.selector_detach=true (the selector loss keeps no LM-head rows and no longer "
                          f"trains the drafter's layers; {'fits' if ok else 'not enough alone'})")
    levers.append(f"the loss chunk (drafter/loss.py CHUNK_ELEMENTS: {fmt_gib(entry['loss_chunk_bytes'])} of "
                  "logits at a time)")
    return levers


def calibrate_rates(cfg: RunConfig, cal: Calibration, rates: dict[str, float | None],
                    flops_per_token: dict[str, float | None], gpus: dict[str, GpuSpec | None],
                    measured: set[str]) -> dict[str, str]:
    """Replace `rates` in place with the calibration's (except the `measured` stages: plan.measured_tokens_per_s
    set them); returns stage -> where the figure came from. `flops_per_token`: this plan's FLOPs a token per
    stage, and under "generate_bytes" its weight bytes read per generated token (the decode model's weights /
    decode_batch)."""
    sources = {}
    cal_peak = cal.gpu.bf16_tflops_peak or (GPUS[cal.gpu.gpu_type].bf16_tflops if cal.gpu.gpu_type in GPUS else None)
    for stage in ("generate", "extract", "train"):
        rate = getattr(cal.rates, stage)
        gpu = gpus.get(stage)
        if rate is None or stage in measured or gpu is None:
            continue
        same_gpu = cal.gpu.gpu_type is not None and gpu.name == GPUS.get(cal.gpu.gpu_type, gpu).name \
            and cal.gpu.gpu_type in GPUS
        plan_flops = flops_per_token.get(stage)
        bandwidth = cal.gpu.memory_bandwidth_gbs or (GPUS[cal.gpu.gpu_type].bandwidth_gbs
                                                     if cal.gpu.gpu_type in GPUS else None)
        plan_bytes = flops_per_token.get("generate_bytes") if stage == "generate" else None
        if stage == "generate" and getattr(rate, "bytes_per_token", None) and bandwidth and plan_bytes:
            # decode reads the weights once a step: the measured share of the bandwidth carries (the planner's
            # decode_efficiency, measured)
            efficiency = rate.tokens_per_s_per_gpu * rate.bytes_per_token / (bandwidth * 1e9)
            rates[stage] = efficiency * gpu.bandwidth_gbs * 1e9 / plan_bytes
            sources[stage] = (f"measured {rate.tokens_per_s_per_gpu:,.0f} tokens/s on {cal.origin()}: "
                              f"{efficiency:.1%} of the memory bandwidth, carried to this target and batch on "
                              f"{gpu.name}")
        elif rate.flops_per_token and cal_peak and plan_flops:
            efficiency = rate.tokens_per_s_per_gpu * rate.flops_per_token / (cal_peak * 1e12)
            rates[stage] = efficiency * gpu.bf16_tflops * 1e12 / plan_flops
            sources[stage] = (f"measured {rate.tokens_per_s_per_gpu:,.0f} tokens/s on {cal.origin()}: "
                              f"{efficiency:.1%} of the bf16 peak, carried to this shape on {gpu.name}")
        elif same_gpu:
            rates[stage] = rate.tokens_per_s_per_gpu
            sources[stage] = f"measured on {cal.origin()}"
    return sources
