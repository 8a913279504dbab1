"""Sections 1-4 and 6 of the check (see __init__.py): extraction, training and q4 features, throughput, lossless
speculative decoding, codec decode, each run on the device side and compared with its CPU reference.

Tolerances: 4x and ~100x what the same comparison gives on CPU (bf16 vs fp32, tiny target, 8 rows/steps)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from bench_codecs import gpu_decode_check

from flashdraft.components.evaluate.evaluate import lossless_mismatches, summarize
from flashdraft.components.evaluate.prompts import EvalPrompt
from flashdraft.components.evaluate.spec import speculative_generate, target_generate
from flashdraft.components.extract.extract import HFFeatureSource
from flashdraft.components.plan.gpus import GPUS
from flashdraft.components.train.distributed import DistEnv
from flashdraft.components.train.trainer import build_model, micro_step
from flashdraft.drafter.attention import allowed_pairs
from flashdraft.drafter.batch import group_sizes, pack
from flashdraft.features.codecs import Codec
from flashdraft.features.shard import EncodedFeatures, Sample
from flashdraft.perf.calibration import TrainShape
from flashdraft.perf.flops import step_flops
from flashdraft.target.model import load_causal_lm
from gpu_check.checks import Report
from gpu_check.targets import sync

EXTRACT_TOL = 0.04   # per-layer relative error of bf16 features; CPU bf16 vs fp32 measures 0.0092-0.0096
LOSS_TOL = 0.005     # relative per-step loss gap; CPU bf16 autocast + bf16 head vs fp32 measures <= 4e-5
Q4_DEFER_TOL = 1e-4  # q4 decodes to the same bits on host and device: only run-to-run kernel noise may differ
TIE_MARGIN = 1e-3    # fp32 target: a divergence where its top-2 logits are closer than this is a numerical tie


# -- 1. extraction ---------------------------------------------------------------------------------------------


def extract(cfg, rows, device: str):
    """(per-sample [T, n, H] bf16 CPU features, tokens/s) through the extract stage's HFFeatureSource."""
    src = HFFeatureSource(cfg, cfg.layer_ids(), device)
    src.features(rows[:2])  # warm-up (kernels, allocator)
    sync(device)
    t = time.perf_counter()
    feats = src.features(rows)
    sync(device)
    seconds = time.perf_counter() - t
    src.close()
    return feats, sum(len(r.input_ids) for r in rows) / seconds


def layer_errors(reference, candidate) -> list[float]:
    """Relative Frobenius error per captured layer over all samples: ||cand - ref|| / ||ref||."""
    num, den = None, None
    for ref, got in zip(reference, candidate, strict=True):
        if ref.shape != got.shape:
            raise ValueError(f"feature shapes differ: {tuple(ref.shape)} vs {tuple(got.shape)}")
        r, d = ref.float(), got.float() - ref.float()
        n_, d_ = d.pow(2).sum(dim=(0, 2)), r.pow(2).sum(dim=(0, 2))
        num, den = (n_, d_) if num is None else (num + n_, den + d_)
    return (num.sqrt() / den.sqrt().clamp_min(1e-30)).tolist()


# -- 2. training -----------------------------------------------------------------------------------------------


def samples_from(rows, feats) -> list[Sample]:
    return [Sample(r.sample_id, torch.tensor(r.input_ids), torch.tensor(r.loss_mask), f.reshape(f.shape[0], -1))
            for r, f in zip(rows, feats, strict=True)]


def train(cfg, groups: list[list[Sample]], device: str, steps: int, seed: int = 0):
    """Per-step losses and step seconds of the trainer's step (build_model, micro_step, clip, AdamW) on `device`.
    CPU: dense SDPA, fp32. CUDA: FlexAttention (compiled), bf16 autocast, bf16 head (the trainer's own choice)."""
    env = DistEnv(0, 1, 0, torch.device(device))
    torch.manual_seed(seed)
    model = build_model(cfg, env)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.training.lr, weight_decay=cfg.training.weight_decay)
    losses, seconds = [], []
    for step in range(steps):
        sync(device)
        t = time.perf_counter()
        stats = micro_step(model, model, groups[step % len(groups)], cfg, 0, env.device, 1.0, sync=True)
        torch.nn.utils.clip_grad_norm_(params, cfg.training.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        seconds.append(time.perf_counter() - t)
        losses.append(float(stats.loss))
    return losses, seconds, model


def q4_groups(groups: list[list[Sample]], num_layers: int) -> tuple[list[list[Sample]], list[list[Sample]]]:
    """The rows' samples through the default q4 codec twice: decoded on the host (the reader's way) and left
    encoded (`EncodedFeatures`, decoded by micro_step on the training device: `training.feature_decode=device`)."""
    codec = Codec.from_params({"name": "q4"})
    host, deferred = [], []
    for group in groups:
        h_row, d_row = [], []
        for s in group:
            t = s.features.shape[0]
            feats = s.features.view(t, num_layers, -1)
            enc = EncodedFeatures(codec, codec.encode(feats), t, num_layers, feats.shape[-1], s.sample_id)
            h_row.append(Sample(s.sample_id, s.input_ids, s.loss_mask, enc.decode()))
            d_row.append(Sample(s.sample_id, s.input_ids, s.loss_mask, enc))
        host.append(h_row)
        deferred.append(d_row)
    return host, deferred


def rows_of(samples: list[Sample], tokens: int) -> list[list[Sample]]:
    """Samples grouped into packed rows the way the trainer groups them (`group_sizes`)."""
    groups, i = [], 0
    for n in group_sizes([int(s.input_ids.numel()) for s in samples], tokens):
        groups.append(samples[i:i + n])
        i += n
    return groups


def loss_gaps(reference: list[float], candidate: list[float]) -> list[float]:
    return [abs(c - r) / max(abs(r), 1e-12) if math.isfinite(c) else math.inf
            for r, c in zip(reference, candidate, strict=True)]


# -- 3. throughput ---------------------------------------------------------------------------------------------


def train_shape(g, cfg, cuda: bool) -> TrainShape:
    """The trainer step of a built drafter (its `geometry`) and `cfg`, on one GPU without a wrapper: what the FLOP
    model and the calibration file take."""
    d = cfg.drafter
    return TrainShape(
        hidden_size=g.hidden_size, num_layers=g.num_layers, num_heads=g.num_heads, num_kv_heads=g.num_kv_heads,
        head_dim=g.head_dim, intermediate_size=g.intermediate_size, vocab_size=g.draft_vocab_size or g.vocab_size,
        target_vocab_size=g.vocab_size, num_features=g.num_features, block_size=g.block_size,
        max_anchors=d.max_anchors, tokens_per_step=cfg.training.tokens_per_step, sliding_window=g.sliding_window,
        strategy="none", world_size=1, autocast="bfloat16" if cuda else "none",
        head_dtype="bfloat16" if cuda else "float32", kind=g.kind, conv_kernel_size=d.conv_kernel_size,
        conv_group_size=d.conv_group_size, selector_rank=d.selector_rank, selector_top_k=d.selector_top_k,
        selector_detach=d.selector_detach)


def row_flops(shape: TrainShape, g, batch) -> dict[str, float]:
    """The FLOP model on one packed row: its tokens, drafted positions, scored slots and the (query, key) pairs
    its mask allows in every layer (the dense mask's count)."""
    layout = batch.layout()
    pairs = sum(allowed_pairs(layout, g.window(i)) for i in range(g.num_layers))
    return step_flops(shape, batch.num_tokens, int(batch.anchors.numel()) * batch.block_size,
                      int(batch.valid.sum()), pairs)


@dataclass
class Throughput:
    tokens_per_s: float
    tflops: float
    step_s: float
    anchors_per_row: float
    losses: list[float]


def throughput(cfg, samples: list[Sample], device: str, steps: int, warmup: int = 2) -> Throughput:
    """The trainer's step timed on `device` over rows of `samples`; the first `warmup` steps (compilation) are not
    counted. FLOPs per step from the FLOP model on the very row that step packed."""
    groups = rows_of(samples, cfg.training.tokens_per_step)
    losses, seconds, model = train(cfg, groups, device, steps)
    timed = range(warmup, steps)
    batches = [pack(groups[k % len(groups)], cfg.drafter.block_size, cfg.drafter.max_anchors,
                    seed=cfg.training.seed, epoch=0, max_tokens=cfg.training.tokens_per_step) for k in timed]
    shape = train_shape(model.geometry, cfg, device.startswith("cuda"))
    flops = sum(sum(row_flops(shape, model.geometry, b).values()) for b in batches)
    total_s = sum(seconds[k] for k in timed)
    return Throughput(sum(b.num_tokens for b in batches) / total_s, flops / total_s / 1e12, total_s / len(timed),
                      sum(int(b.anchors.numel()) for b in batches) / len(batches), losses)


def peak_tflops(device_name: str) -> tuple[str, float] | None:
    """(the planner's GPU key, its datasheet dense bf16 TFLOP/s) for a driver-reported name, or None."""
    name = device_name.lower().replace(" ", "")
    for key in ("b200", "h200", "h100", "a100", "l40s"):
        if key in name:
            return key, GPUS[key].bf16_tflops
    if "rtxpro6000" in name:
        return "rtx-pro-6000", GPUS["rtx-pro-6000"].bf16_tflops
    return None


def matmul_tflops(device: str, n: int = 8192, reps: int = 10) -> float:
    a, b = torch.randn(n, n, device=device, dtype=torch.bfloat16), torch.randn(n, n, device=device,
                                                                               dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


# -- 4. evaluation ---------------------------------------------------------------------------------------------


def evaluate(cfg, model, rows, device: str, max_new_tokens: int):
    """(mismatches that are not ties, ties, tau) of speculative decoding with `model` against plain greedy."""
    target = load_causal_lm(cfg.target, device=device)
    drafter = model.eval()
    drafter.set_frozen(drafter.embed_weight.float(), drafter.lm_head_weight.float())
    prompts = [EvalPrompt(r.sample_id, r.input_ids[: len(r.input_ids) // 2], "random") for r in rows]
    eos = {int(target.config.eos_token_id)}
    ref = [target_generate(target, p.input_ids, max_new_tokens, eos) for p in prompts]
    spec = [speculative_generate(target, drafter, p.input_ids, cfg.layer_ids(), max_new_tokens, eos)
            for p in prompts]
    bad = lossless_mismatches(prompts, ref, spec, "trained", tie_margin=TIE_MARGIN)
    return [b for b in bad if not b.tie], [b for b in bad if b.tie], summarize(spec).tau


# -- 6. codecs -------------------------------------------------------------------------------------------------


def codec_decode(report: Report, device: str, tokens: int, hidden: int) -> None:
    """The feature codecs decoded on `device` against their CPU decode (benchmarks/bench_codecs.py): bit-identical
    (rotated candidates: max relative difference <= 1e-2), and GB/s of bf16 output on each side."""
    for row in gpu_decode_check(device, tokens=tokens, hidden=hidden):
        exact = row["exact_expected"]
        report.add(f"decode/{row['codec']} on {device.split(':')[0]}",
                   float(row["mismatches"]) if exact else row["max_rel_diff"], 0.0 if exact else 1e-2,
                   f"{'values differing from' if exact else 'max rel. diff vs'} the CPU decode; "
                   f"{row['gbs']:.2f} GB/s (CPU {row['cpu_gbs']:.2f})")
