"""Section 5: the `qwen3.6-27b` preset's own drafter (5 x 5120, 32 x 128 heads, 8 KV heads, MLP 17408, window 2048,
block 16, 512 anchors a sample, the full 248,320-token frozen head) trained by the trainer's step at the production
per-GPU row (`training.tokens_per_step`, 8,192) for each `training.activation_checkpointing` choice: tokens/s, step
time by part, TFLOP/s and peak allocated memory (out of memory is a row, not a crash); the same for DFlash2 (peaks
only); then the extraction prefill through a random target of the full Qwen3.6-27B architecture (cut after the
deepest feature layer, as the extract stage cuts it) capturing the five feature layers; then section 6."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen3_5ForCausalLM

from flashdraft.components.train import trainer
from flashdraft.components.train.distributed import DistEnv
from flashdraft.config import load_config
from flashdraft.drafter import loss
from flashdraft.drafter.batch import pack
from flashdraft.features.shard import Sample
from flashdraft.perf.calibration import TrainShape
from flashdraft.target.capture import capture_layers
from flashdraft.target.model import qwen36_27b_text_config
from gpu_check.checks import Report
from gpu_check.sections import codec_decode, peak_tflops, row_flops, rows_of, train_shape
from gpu_check.targets import random_rows, save_tokenizer, sync

PRODUCTION_PRESET = "qwen3.6-27b"
RECOMPUTE = ("none", "mlp", "layer")


def production_target(folder: Path, device: str, num_layers: int = 64, **scale) -> Path:
    """The drafter's view of Qwen3.6-27B: its real config (flashdraft.target.model.qwen36_27b_text_config) with random
    bf16 `embed_tokens` and `lm_head` (the only target tensors the drafter reads) and a word-level tokenizer over
    its vocabulary. Throughput and memory do not depend on the weights' values. `scale` overrides config fields
    (hidden_size, vocab_size, ...): only the CPU dry-run uses it."""
    if (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    config = qwen36_27b_text_config(num_layers)
    for key, value in scale.items():
        setattr(config, key, value)
    config.architectures = ["Qwen3_5ForCausalLM"]
    gen = torch.Generator(device=device).manual_seed(0)
    V, H = config.vocab_size, config.hidden_size
    tensors = {name: (torch.randn(V, H, generator=gen, device=device) * 0.02).to(torch.bfloat16).cpu()
               for name in ("model.embed_tokens.weight", "lm_head.weight")}
    save_file(tensors, str(folder / "model.safetensors"))
    config.save_pretrained(folder)
    save_tokenizer(folder, V)
    return folder


def production_config(folder: Path, work: Path, **overrides):
    """The production preset itself, pointed at `folder` and a local store; `overrides` as `--set` would."""
    return load_config(preset=PRODUCTION_PRESET, overrides={
        "target.source": "hf", "target.model": str(folder), "storage.root": f"file://{work}/runs",
        "training.nproc_per_node": 1, "drafter.mask_token_id": 248070, **overrides})


@dataclass
class StepParts:
    """One production-shape training configuration, measured (or out of memory)."""

    label: str
    recompute: str                # training.activation_checkpointing of this configuration
    tokens_per_s: float = 0.0
    step_s: float = 0.0
    parts_s: dict[str, float] = field(default_factory=dict)   # forward, loss, backward, optimizer
    tflops: float = 0.0
    peak_bytes: int = 0
    anchors_per_row: float = 0.0
    oom: str | None = None


def timed_steps(model, params, opt, cfg, rows, device: str, steps: int, warmup: int, label: str,
                recompute: str) -> StepParts:
    """The trainer's step (pack, drafter forward under bf16 autocast, `drafter_loss`, backward, clip, AdamW), with
    CUDA events between its parts; the first `warmup` steps (compilation, allocator growth) are not timed. Peak
    memory is the allocator's over all steps, state included."""
    d, dev = cfg.drafter, torch.device(device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    shape = train_shape(model.geometry, cfg, cuda)
    names = ("forward", "loss", "backward", "optimizer")
    totals = dict.fromkeys(names, 0.0)
    tokens = flops = anchors = 0
    try:
        for step in range(steps):
            batch = pack(rows[step % len(rows)], d.block_size, d.max_anchors, seed=cfg.training.seed, epoch=step,
                         max_tokens=cfg.training.tokens_per_step)
            parts = row_flops(shape, model.geometry, batch)
            batch = batch.to(dev)
            marks = [_mark(cuda)]
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
                hidden = model(*batch.drafter_inputs())
            marks.append(_mark(cuda))
            out = trainer.drafter_loss(model, hidden, batch, d)
            marks.append(_mark(cuda))
            out.loss.backward()
            marks.append(_mark(cuda))
            torch.nn.utils.clip_grad_norm_(params, cfg.training.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            marks.append(_mark(cuda))
            sync(device)
            if step >= warmup:
                for name, a, b in zip(names, marks, marks[1:], strict=False):
                    totals[name] += _elapsed(a, b)
                tokens += batch.num_tokens
                flops += sum(parts.values())
                anchors += int(batch.anchors.numel())
            del hidden, out, batch
    except torch.cuda.OutOfMemoryError as e:
        opt.zero_grad(set_to_none=True)
        peak = torch.cuda.max_memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.empty_cache()
        return StepParts(label, recompute, peak_bytes=peak, oom=str(e).split("\n")[0][:160])
    timed = steps - warmup
    total_s = sum(totals.values())
    return StepParts(label, recompute, tokens / total_s, total_s / timed, {k: v / timed for k, v in totals.items()},
                     flops / total_s / 1e12, torch.cuda.max_memory_allocated() if cuda else 0, anchors / timed)


def _mark(cuda: bool):
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _elapsed(a, b) -> float:
    return a.elapsed_time(b) / 1e3 if hasattr(a, "elapsed_time") else b - a


@dataclass
class DryRun:
    """The production section at toy widths, for the CPU dry-run (tests/unit/test_gpu_check.py): the same code
    path, config keys and JSON, none of the sizes."""

    layers: int = 8
    target: dict = field(default_factory=lambda: {"hidden_size": 128, "vocab_size": 2048, "pad_token_id": 0,
                                                  "eos_token_id": 2})
    overrides: dict = field(default_factory=lambda: {
        "target.num_layers": 8, "target.hidden_size": 128, "drafter.hidden_size": 128, "drafter.num_layers": 2,
        "drafter.num_heads": 4, "drafter.num_kv_heads": 2, "drafter.head_dim": 32,
        "drafter.intermediate_size": 256, "drafter.sliding_window": 64, "drafter.max_anchors": 24,
        "drafter.mask_token_id": 2047, "training.tokens_per_step": 512})
    samples: tuple = (12, (100, 200))
    extract: dict = field(default_factory=lambda: {"tokens": 64, "rows": 1, "budget_s": 1.0,
                                                   "hidden_size": 128, "intermediate_size": 256,
                                                   "vocab_size": 2048, "pad_token_id": 0, "eos_token_id": 2})


def production_train(work: Path, device: str, scale: DryRun | None = None, steps: int = 5, warmup: int = 2,
                     recompute: tuple[str, ...] = RECOMPUTE, kind: str = "dflash",
                     ) -> tuple[list[StepParts], object]:
    """The production drafter's step for each activation-checkpointing choice (one model and optimizer, so the
    optimizer state is allocated once and counted in every peak)."""
    folder = production_target(work / "qwen3.6-27b-head", device, *((scale.layers,) if scale else ()),
                               **(scale.target if scale else {}))
    cfg = production_config(folder, work, **(scale.overrides if scale else {}), **{"drafter.kind": kind})
    torch.manual_seed(0)
    model = trainer.build_model(cfg, DistEnv(0, 1, 0, torch.device(device)))
    prefix = "" if kind == "dflash" else f"{kind} "
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.training.lr, weight_decay=cfg.training.weight_decay)
    H, n = model.geometry.hidden_size, model.geometry.num_features
    samples = production_samples(n * H, model.geometry.vocab_size, *(scale.samples if scale else ()))
    rows = rows_of(samples, cfg.training.tokens_per_step)
    results = []
    for mode in recompute:
        model.set_activation_checkpointing(mode)
        results.append(timed_steps(model, params, opt, cfg, rows, device, steps, warmup,
                                   f"{prefix}recompute={mode}", mode))
    if recompute[0] == "none" and device.startswith("cuda") and kind == "dflash":  # the fused loss's gain, side by side
        model.set_activation_checkpointing("none")
        fused, loss._chunk_fn = loss._chunk_fn, lambda hidden: None
        try:
            results.append(timed_steps(model, params, opt, cfg, rows, device, steps, warmup,
                                       "recompute=none, eager loss", "none"))
        finally:
            loss._chunk_fn = fused
    return results, model


def production_samples(width: int, vocab: int, count: int = 40, lengths: tuple[int, int] = (600, 1200)):
    """Random 600-1200-token samples (prompt half, response half) with random bf16 features of `width`."""
    rows = random_rows(count, lengths, vocab, seed=3)
    g = torch.Generator().manual_seed(4)
    return [Sample(r.sample_id, torch.tensor(r.input_ids), torch.tensor(r.loss_mask),
                   torch.randn(len(r.input_ids), width, generator=g).to(torch.bfloat16)) for r in rows]


def production_extract(device: str, layer_ids: list[int], tokens: int = 4096, rows: int = 2,
                       budget_s: float = 45.0, **scale) -> tuple[float, float]:
    """(tokens/s, peak GiB) of the extract stage's prefill through a random bf16 Qwen3.6-27B text model cut after
    its deepest feature layer, capturing `layer_ids` (flashdraft.target.capture, as HFFeatureSource does); as many
    timed forwards of `rows` x `tokens` as fit in `budget_s` after one warm-up."""
    config = qwen36_27b_text_config(max(layer_ids) + 1)
    for key, value in scale.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3_5ForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(4, config.vocab_size - 1, (rows, tokens), device=device)
    done, seconds = 0, 0.0
    with torch.no_grad(), capture_layers(model, layer_ids, stop_after_deepest=True) as cap:
        cap.forward(input_ids=ids[:, : tokens // 4])
        cap.features()
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        while seconds < budget_s and done < 8:
            sync(device)
            t = time.perf_counter()
            cap.forward(input_ids=ids)
            feats = cap.features()
            sync(device)
            seconds += time.perf_counter() - t
            done += 1
            if tuple(feats.shape) != (rows, tokens, len(layer_ids) * config.hidden_size):
                raise RuntimeError(f"captured {tuple(feats.shape)}, expected {(rows, tokens)} x "
                                   f"{len(layer_ids)} x {config.hidden_size}")
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    del model
    if cuda:
        torch.cuda.empty_cache()
    return done * rows * tokens / seconds, peak


@dataclass
class Production:
    """What section 5 measured, for the report and the calibration file."""

    train: list[StepParts]
    shape: TrainShape      # the trainer step's geometry and batch (anchors and recompute per measurement)
    extract_tokens_per_s: float | None = None
    extract_layers: list[int] = field(default_factory=list)
    extract_forward_tokens: int = 0
    extract_hidden: int = 0
    flops_per_token: float | None = None
    dflash2: list[StepParts] = field(default_factory=list)  # the same step with drafter.kind=dflash2 (peaks only)


def report_steps(report: Report, results: list[StepParts], cuda: bool, flops: bool,
                 row: tuple[int, int] | None = None) -> None:
    """One report row per measured configuration (out of memory, or tokens/s with the step's parts); with `flops`,
    its TFLOP/s against the bf16 peak and, on CUDA, its peak memory as rows of their own, else the peak in the
    detail. `row`: (block size, tokens a row) for the anchors note."""
    peak = peak_tflops(torch.cuda.get_device_name()) if cuda else None
    total = torch.cuda.get_device_properties(0).total_memory if cuda else 0
    for r in results:
        name = f"train/{PRODUCTION_PRESET} {r.label}"
        if r.oom:
            report.add(f"{name} tokens/s", None, None, f"out of memory at {r.peak_bytes / 2**30:.1f} GiB: {r.oom}")
            continue
        parts = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in r.parts_s.items())
        detail = f"step {r.step_s * 1e3:.0f} ms ({parts} ms)"
        if row:
            detail += f"; ~{r.anchors_per_row:.0f} anchors x {row[0]} a {row[1]}-token row"
        if not flops:
            report.add(f"{name} tokens/s", r.tokens_per_s, None,
                       detail + (f"; peak {r.peak_bytes / 2**30:.1f} GiB" if cuda else ""))
            continue
        report.add(f"{name} tokens/s", r.tokens_per_s, None, detail)
        report.add(f"{name} TFLOP/s", r.tflops, None,
                   f"{r.tflops / peak[1]:.1%} of {peak[0]} bf16 peak" if peak else "")
        if cuda:
            report.add(f"{name} peak GiB", r.peak_bytes / 2**30, total / 2**30,
                       "allocator peak, unsharded fp32 weights, grads and AdamW state included (one GPU, no FSDP)")


def production(report: Report, work: Path, device: str, scale: DryRun | None = None) -> Production:
    """The production rows of the report (the module docstring) and what the calibration file takes of them."""
    cuda = device.startswith("cuda")
    results, model = production_train(work, device, scale, steps=3 if scale else 5, warmup=1 if scale else 2)
    cfg = production_config(work / "qwen3.6-27b-head", work, **(scale.overrides if scale else {}))
    g = model.geometry
    report_steps(report, results, cuda, flops=True, row=(g.block_size, cfg.training.tokens_per_step))
    fitted = [r for r in results if not r.oom]
    best = max(fitted, key=lambda r: r.tokens_per_s) if fitted else None
    out = Production(results, train_shape(g, cfg, cuda),
                     flops_per_token=best.tflops * 1e12 / best.tokens_per_s if best else None)
    del model
    if cuda:
        torch.cuda.empty_cache()
    dflash2, model = production_train(work, device, scale, steps=3 if scale else 5, warmup=1 if scale else 2,
                                      recompute=("mlp", "layer"), kind="dflash2")  # unsharded, none and mlp
    # ran out of memory on the H200 (and the memory model predicts it): mlp checks that, layer measures a peak
    report_steps(report, dflash2, cuda, flops=False)  # DFlash2's rows report peaks only
    out.dflash2 = dflash2
    del model
    if cuda:
        torch.cuda.empty_cache()
    depth = cfg.target.num_layers or 64
    layers = cfg.layer_ids(depth)
    extract_scale = dict(scale.extract) if scale else {}
    tokens, rows = extract_scale.pop("tokens", 4096), extract_scale.pop("rows", 2)
    budget = extract_scale.pop("budget_s", 45.0)
    tps, gib = production_extract(device, layers, tokens, rows, budget, **extract_scale)
    report.add(f"extract/{PRODUCTION_PRESET} tokens/s", tps, None,
               f"HF prefill {'bf16' if cuda else 'cpu'}, {rows} x {tokens} tokens, {max(layers) + 1} layers run, "
               f"layers {layers} captured" + (f"; peak {gib:.1f} GiB" if cuda else ""))
    out.extract_tokens_per_s, out.extract_layers = tps, layers
    codec_decode(report, device, tokens=64 if scale else 2048, hidden=128 if scale else 5120)
    out.extract_forward_tokens, out.extract_hidden = rows * tokens, extract_scale.get("hidden_size", 5120)
    return out
