"""`make gpu-check`: the CUDA code paths on one real GPU, each compared with the CPU reference it must equal.

Runs from a copy of the repository on a machine with one CUDA GPU and PyTorch + transformers preinstalled (no
network, no pip, nothing installed: the device tool's H200 image). What that image lacks and flashdraft imports
(pydantic and its three helpers, zstandard), and transformers at the version flashdraft is tested with (the image's
5.17 still names the decoder cache `past_key_values`, which the evaluate stage's `cache=` calls would silently
bypass), travel as wheels in benchmarks/gpu_wheels/ (`make gpu-wheels`; ignored by git, carried to the machine);
each wheel whose distribution is missing or at another version is unpacked onto the front of sys.path here. The
targets are random models built here from configs (seeded), saved with a word-level tokenizer so every stage loads
them like any HF folder. Checks, one table, exit status 1 on any failure:

1. extract: `HFFeatureSource` (the extract stage's prefill) on CUDA in bf16 with forward_tokens = batch_tokens,
   against the same rows on CPU in fp32 (the CPU forward size), for the tiny target (the tiny preset's Qwen3
   config) and a few Qwen3-8B layers at hidden 4096: per captured layer ||cuda - cpu|| / ||cpu|| <= EXTRACT_TOL.
2. train: the trainer's own `build_model` + `micro_step` + AdamW/clip on the same packed rows (built from the CPU
   features), on CUDA (FlexAttention compiled, bf16 autocast, bf16 LM head) and on CPU (dense SDPA, fp32): every
   step's loss within LOSS_TOL (relative) of the CPU loss.
3. throughput: extraction tokens/s on both targets; training tokens/s and achieved TFLOP/s of the drafter step at
   hidden 4096 (analytic FLOPs, `step_flops`, over the measured step time) as a fraction of the datasheet bf16
   peak (components/plan/gpus.py) and of a bf16 matmul measured here.
4. evaluate: speculative decoding with the trained drafter on CUDA against the target's own greedy decode: lossless
   (no divergence except numerical ties, top-2 gap < TIE_MARGIN, in the fp32 tiny target), and tau.
5. production (`--production`, on by default on CUDA): the `qwen3.6-27b` preset's own drafter (5 x 5120, 32 x 128
   heads, 8 KV heads, MLP 17408, window 2048, block 16, 512 anchors a sample, the full 248,320-token frozen head)
   trained by the trainer's step at the production per-GPU row (`training.tokens_per_step`, 8,192) for each
   `training.activation_checkpointing` choice: tokens/s, step time by part (forward, loss, backward, optimizer),
   TFLOP/s and peak allocated memory; an out-of-memory is a row of the table, not a crash. Then extraction prefill
   through a random target of the full Qwen3.6-27B architecture (64-layer hybrid, cut after the deepest feature
   layer as the extract stage cuts it) in bf16, capturing the five feature layers: tokens/s. The figures are also
   written as JSON (`--json`) for `flashdraft plan --calibrate`.
6. codecs (with section 5): every 4-bit candidate and fp8 decoded on the GPU from host bytes
   (benchmarks/bench_codecs.py's `gpu_decode_check`): bit-identical to the CPU decode (rotated candidates: max
   relative difference <= 1e-2), and GB/s of bf16 output on each side.

The CPU half (reference computations, comparisons, the table and the exit status) runs in CI: tests/unit/
test_gpu_check.py, with the "device" side on CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flashdraft.features.shard import Sample

REPO = Path(__file__).resolve().parents[1]
WHEELS = Path(__file__).with_name("gpu_wheels")

# Tolerances: 4x and ~100x what the same comparison gives on CPU (bf16 vs fp32, tiny target, 8 rows/steps):
EXTRACT_TOL = 0.04   # per-layer relative error of bf16 features; CPU bf16 vs fp32 measures 0.0092-0.0096
LOSS_TOL = 0.005     # relative per-step loss gap; CPU bf16 autocast + bf16 head vs fp32 measures <= 4e-5
Q4_DEFER_TOL = 1e-4  # q4 decodes to the same bits on host and device: only run-to-run kernel noise may differ
TIE_MARGIN = 1e-3    # fp32 target: a divergence where its top-2 logits are closer than this is a numerical tie


def carried_wheels(wheels: Path = WHEELS, label: str = "gpu-check") -> Path | None:
    """Unpack every carried wheel whose distribution is missing here or at another version into a fresh folder
    put first on sys.path; returns that folder (None when nothing was needed). `make gpu-e2e` reuses it and also
    hands the folder to its subprocesses (PYTHONPATH)."""
    from importlib import metadata

    wanted = []
    for wheel in sorted(wheels.glob("*.whl")):
        dist, version = wheel.name.split("-")[:2]
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wanted.append(wheel)
    if not wanted:
        return None
    site = Path(tempfile.mkdtemp(prefix=f"{label}-wheels-"))
    for wheel in wanted:
        zipfile.ZipFile(wheel).extractall(site)
    sys.path.insert(0, str(site))
    print(f"{label}: using carried {', '.join(w.name.split('-')[0] for w in wanted)}", file=sys.stderr)
    return site


def bootstrap() -> None:
    """Make the repository importable as installed (flashdraft, flashdraft.components) with the carried wheels."""
    for folder in (REPO, REPO / "benchmarks"):  # flashdraft itself; bench_codecs (section 6)
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    carried_wheels()
    if importlib.util.find_spec("pydantic") is None:
        raise SystemExit(f"gpu-check: pydantic is not installed and {WHEELS} has no wheels: run `make gpu-wheels` "
                         "on a machine with network access and carry benchmarks/gpu_wheels")
    try:
        import flashdraft.components  # noqa: F401  (installed: package-dir maps it to components/)
    except ImportError:
        import flashdraft

        spec = importlib.util.spec_from_file_location("flashdraft.components", REPO / "components" / "__init__.py",
                                                      submodule_search_locations=[str(REPO / "components")])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["flashdraft.components"] = mod
        spec.loader.exec_module(mod)
        flashdraft.components = mod


# -- results ---------------------------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    value: float | None   # the compared quantity (None: informational row)
    limit: float | None   # pass iff value <= limit; None: informational
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.limit is None or (self.value is not None and math.isfinite(self.value) and
                                      self.value <= self.limit)


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, value: float | None, limit: float | None = None, detail: str = "") -> Check:
        c = Check(name, value, limit, detail)
        self.checks.append(c)
        return c

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def table(self) -> str:
        rows = [("check", "value", "limit", "result", "detail")]
        for c in self.checks:
            rows.append((c.name, "-" if c.value is None else f"{c.value:.4g}",
                         "-" if c.limit is None else f"{c.limit:.4g}",
                         "info" if c.limit is None else ("ok" if c.ok else "FAIL"), c.detail))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


# -- targets ---------------------------------------------------------------------------------------------------


@dataclass
class TargetSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    def hf_config(self):
        from transformers import Qwen3Config

        return Qwen3Config(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, head_dim=self.head_dim, rope_theta=1_000_000.0,
                           max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
                           eos_token_id=2, pad_token_id=0)


TINY = TargetSpec("tiny", 8, 256, 4, 2, 64, 768, 49152)              # the tiny preset's shape (flashdraft.target)
WIDE = TargetSpec("qwen3-4096", 8, 4096, 32, 8, 128, 12288, 151936)  # Qwen3-8B's layer shape and vocabulary


def build_target(spec: TargetSpec, folder: Path, seed: int = 0, device: str = "cpu", dtype: str = "float32") -> Path:
    """A seeded random Qwen3 saved as an HF folder (weights in `dtype`, a word-level tokenizer over its vocabulary;
    `device` only speeds up the random init)."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(spec.hf_config()).to(getattr(torch, dtype))
    model.save_pretrained(folder, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(spec.vocab)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")),
                                  pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3")
    tok.save_pretrained(folder)
    return folder


def run_config(folder: Path, spec: TargetSpec, work: Path, *, drafter_layers: int = 1, block_size: int = 8,
               max_anchors: int = 64, tokens_per_step: int = 2048, lr: float = 1e-3,
               sliding_window: int | None = None, layer_types: list[str] | None = None):
    from flashdraft.config import load_config

    return load_config(preset="tiny", overrides={
        "target.source": "hf", "target.model": str(folder), "target.dtype": "float32",
        "target.num_layers": spec.layers, "target.hidden_size": spec.hidden,
        "storage.root": f"file://{work}/runs", "features.batch_tokens": 8192,
        "drafter.num_layers": drafter_layers, "drafter.block_size": block_size,
        "drafter.max_anchors": max_anchors, "drafter.mask_token_id": spec.vocab - 1,
        "training.tokens_per_step": tokens_per_step, "training.lr": lr, "training.grad_clip": 1.0,
        "drafter.sliding_window": sliding_window, "drafter.layer_types": layer_types})


def random_rows(n: int, lengths: tuple[int, int], vocab: int, seed: int):
    """Rows of random tokens (prompt + response halves); only the response half carries the loss."""
    import torch

    from flashdraft.components.extract.extract import Row

    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        T = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=g))
        ids = torch.randint(4, vocab - 1, (T,), generator=g).tolist()
        rows.append(Row(f"s{i}", ids, [0] * (T // 2) + [1] * (T - T // 2)))
    return rows


# -- extraction ------------------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def extract(cfg, rows, device: str):
    """(per-sample [T, n, H] bf16 CPU features, tokens/s) through the extract stage's HFFeatureSource."""
    from flashdraft.components.extract.extract import HFFeatureSource

    src = HFFeatureSource(cfg, cfg.layer_ids(), device)
    src.features(rows[:2])  # warm-up (kernels, allocator)
    _sync(device)
    t = time.perf_counter()
    feats = src.features(rows)
    _sync(device)
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


# -- training --------------------------------------------------------------------------------------------------


def samples_from(rows, feats) -> list[Sample]:
    import torch

    from flashdraft.features.shard import Sample

    return [Sample(r.sample_id, torch.tensor(r.input_ids), torch.tensor(r.loss_mask), f.reshape(f.shape[0], -1))
            for r, f in zip(rows, feats, strict=True)]


def train(cfg, groups: list[list[Sample]], device: str, steps: int, seed: int = 0):
    """Per-step losses and step seconds of the trainer's step (build_model, micro_step, clip, AdamW) on `device`.
    CPU: dense SDPA, fp32. CUDA: FlexAttention (compiled), bf16 autocast, bf16 head (the trainer's own choice)."""
    import torch

    from flashdraft.components.train.distributed import DistEnv
    from flashdraft.components.train.trainer import build_model, micro_step

    env = DistEnv(0, 1, 0, torch.device(device))
    torch.manual_seed(seed)
    model = build_model(cfg, env)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.training.lr, weight_decay=cfg.training.weight_decay)
    losses, seconds = [], []
    for step in range(steps):
        _sync(device)
        t = time.perf_counter()
        stats = micro_step(model, model, groups[step % len(groups)], cfg, 0, env.device, 1.0, sync=True)
        torch.nn.utils.clip_grad_norm_(params, cfg.training.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        seconds.append(time.perf_counter() - t)
        losses.append(float(stats.loss))
    return losses, seconds, model


def q4_groups(groups: list[list[Sample]], num_layers: int) -> tuple[list[list[Sample]], list[list[Sample]]]:
    """The rows' samples through the default q4 codec twice: decoded on the host (the reader's way) and left
    encoded (`EncodedFeatures`, decoded by micro_step on the training device: `training.feature_decode=device`)."""
    from flashdraft.features.codecs import Codec
    from flashdraft.features.shard import EncodedFeatures, Sample

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
    from flashdraft.drafter.batch import group_sizes

    groups, i = [], 0
    for n in group_sizes([int(s.input_ids.numel()) for s in samples], tokens):
        groups.append(samples[i:i + n])
        i += n
    return groups


@dataclass
class Throughput:
    tokens_per_s: float
    tflops: float
    step_s: float
    anchors_per_row: float
    losses: list[float]


def throughput(cfg, samples: list[Sample], device: str, steps: int, warmup: int = 2) -> Throughput:
    """The trainer's step timed on `device` over rows of `samples`; the first `warmup` steps (compilation) are not
    counted. FLOPs per step from `step_flops` on the very row that step packed."""
    from flashdraft.drafter.batch import pack

    groups = rows_of(samples, cfg.training.tokens_per_step)
    losses, seconds, model = train(cfg, groups, device, steps)
    timed = range(warmup, steps)
    batches = [pack(groups[k % len(groups)], cfg.drafter.block_size, cfg.drafter.max_anchors,
                    seed=cfg.training.seed, epoch=0, max_tokens=cfg.training.tokens_per_step) for k in timed]
    flops = sum(total_flops(step_flops(model.geometry, b)) for b in batches)
    total_s = sum(seconds[k] for k in timed)
    return Throughput(sum(b.num_tokens for b in batches) / total_s, flops / total_s / 1e12, total_s / len(timed),
                      sum(int(b.anchors.numel()) for b in batches) / len(batches), losses)


def loss_gaps(reference: list[float], candidate: list[float]) -> list[float]:
    return [abs(c - r) / max(abs(r), 1e-12) if math.isfinite(c) else math.inf
            for r, c in zip(reference, candidate, strict=True)]


def step_flops(g, batch) -> dict[str, float]:
    """Matmul FLOPs of one training step (forward + backward) on one packed row, counted from the shapes.

    Forward, per context token: fc (2*n*H*H) and every layer's K/V projections (2*2*H*kv*hd); per block token:
    q, o, k, v projections and the MLP; attention 4*hd*heads per allowed (query, key) pair (QK^T and PV, the
    dense mask's count); LM head 2*V*H per drafted slot. Backward: twice the forward (input and weight
    gradients), except fc (weight gradient only: the features need none) and the frozen LM head (input gradient
    only), once. DFlash2 adds, per block token and layer, its two block convolutions' kernel projections
    (2*H*2*taps*groups each; the depthwise convolution itself is elementwise) and, per scored slot, the candidate
    selector: hidden projection 2*H*r, pairwise scores 2*r*k and the candidates' unary logits 2*k*H (the
    candidates come from the head's logits the loss forms anyway); backward as above, the unary part only
    through the slot state. The matmul part equals torch's FlopCounterMode on a real step, DFlash and DFlash2
    (tests/unit/test_gpu_check.py). Returns {"matmul": projections, MLP, head and DFlash2's parts, "attention":
    ...}; `head` (the LM head's share of "matmul") is also given."""
    from flashdraft.drafter.attention import allowed_pairs

    S, N, B = batch.num_tokens, int(batch.anchors.numel()), batch.block_size
    H, hd, nh, kv, inter = g.hidden_size, g.head_dim, g.num_heads, g.num_kv_heads, g.intermediate_size
    fc, ctx_kv = S * 2 * g.num_features * H * H, S * g.num_layers * 4 * H * kv * hd
    per_block_token = g.num_layers * (4 * H * nh * hd + 4 * H * kv * hd + 6 * H * inter)
    layout = batch.layout()
    pairs = sum(allowed_pairs(layout, g.window(i)) for i in range(g.num_layers))
    attn = 4 * hd * nh * pairs
    rows = int(batch.valid.sum())
    head = 2 * g.vocab_size * H * rows
    extra = 0
    if g.kind == "dflash2":
        taps, groups, r, k = g.conv_kernel_size, H // g.conv_group_size, g.selector_rank, g.selector_top_k
        extra = 3 * N * B * g.num_layers * 2 * (2 * H * 2 * taps * groups)
        extra += rows * (3 * 2 * H * r + 3 * 2 * r * k + 2 * 2 * k * H)
    return {"matmul": 2 * fc + 3 * (ctx_kv + N * B * per_block_token) + 2 * head + extra, "attention": 3 * attn,
            "head": 2 * head}


def total_flops(parts: dict[str, float]) -> float:
    return parts["matmul"] + parts["attention"]


def peak_tflops(device_name: str) -> tuple[str, float] | None:
    from flashdraft.components.plan.gpus import GPUS

    name = device_name.lower().replace(" ", "")
    for key in ("b200", "h200", "h100", "a100", "l40s"):
        if key in name:
            return key, GPUS[key].bf16_tflops
    if "rtxpro6000" in name:
        return "rtx-pro-6000", GPUS["rtx-pro-6000"].bf16_tflops
    return None


def matmul_tflops(device: str, n: int = 8192, reps: int = 10) -> float:
    import torch

    a, b = torch.randn(n, n, device=device, dtype=torch.bfloat16), torch.randn(n, n, device=device,
                                                                               dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


# -- evaluation ------------------------------------------------------------------------------------------------


def evaluate(cfg, model, rows, device: str, max_new_tokens: int):
    """(mismatches that are not ties, ties, tau) of speculative decoding with `model` against plain greedy."""
    from flashdraft.components.evaluate.evaluate import lossless_mismatches, summarize
    from flashdraft.components.evaluate.prompts import EvalPrompt
    from flashdraft.components.evaluate.spec import speculative_generate, target_generate
    from flashdraft.target import load_causal_lm

    target = load_causal_lm(cfg.target, device=device)
    drafter = model.eval()
    drafter.set_frozen(drafter.embed_weight.float(), drafter.lm_head_weight.float())
    prompts = [EvalPrompt(r.sample_id, r.input_ids[: len(r.input_ids) // 2], "random") for r in rows]
    eos = {int(target.config.eos_token_id)}
    ref = [target_generate(target, p.input_ids, max_new_tokens, eos) for p in prompts]
    spec = [speculative_generate(target, drafter, p.input_ids, cfg.layer_ids(), max_new_tokens, eos)
            for p in prompts]
    bad = lossless_mismatches(prompts, ref, spec, "trained", tie_margin=TIE_MARGIN)
    return [b for b in bad if not b["tie"]], [b for b in bad if b["tie"]], summarize(spec).get("tau")


# -- the production shapes -------------------------------------------------------------------------------------

PRODUCTION_PRESET = "qwen3.6-27b"
RECOMPUTE = ("none", "mlp", "layer")


def production_target(folder: Path, device: str, num_layers: int = 64, **scale) -> Path:
    """The drafter's view of Qwen3.6-27B: its real config (flashdraft.target.qwen36_27b_text_config) with random
    bf16 `embed_tokens` and `lm_head` (the only target tensors the drafter reads) and a word-level tokenizer over
    its vocabulary. Throughput and memory do not depend on the weights' values. `scale` overrides config fields
    (hidden_size, vocab_size, ...): only the CPU dry-run uses it."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from flashdraft.target import qwen36_27b_text_config

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
    vocab = {f"t{i}": i for i in range(V)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")),
                                  pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3")
    tok.save_pretrained(folder)
    return folder


def production_config(folder: Path, work: Path, **overrides):
    """The production preset itself, pointed at `folder` and a local store; `overrides` as `--set` would."""
    from flashdraft.config import load_config

    return load_config(preset=PRODUCTION_PRESET, overrides={
        "target.source": "hf", "target.model": str(folder), "storage.root": f"file://{work}/runs",
        "training.nproc_per_node": 1, "drafter.mask_token_id": 248070, **overrides})


@dataclass
class StepParts:
    """One production-shape training configuration, measured (or out of memory)."""

    label: str
    tokens_per_s: float = 0.0
    step_s: float = 0.0
    parts_s: dict[str, float] = field(default_factory=dict)   # forward, loss, backward, optimizer
    tflops: float = 0.0
    peak_bytes: int = 0
    anchors_per_row: float = 0.0
    oom: str | None = None


def timed_steps(model, params, opt, cfg, rows, device: str, steps: int, warmup: int, label: str) -> StepParts:
    """The trainer's step (pack, drafter forward under bf16 autocast, `drafter_loss`, backward, clip, AdamW), with
    CUDA events between its parts; the first `warmup` steps (compilation, allocator growth) are not timed. Peak
    memory is the allocator's over all steps, state included."""
    import torch

    from flashdraft.components.train.trainer import drafter_loss
    from flashdraft.drafter.batch import pack

    d, dev = cfg.drafter, torch.device(device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    names = ("forward", "loss", "backward", "optimizer")
    totals = dict.fromkeys(names, 0.0)
    tokens = flops = anchors = 0
    try:
        for step in range(steps):
            batch = pack(rows[step % len(rows)], d.block_size, d.max_anchors, seed=cfg.training.seed, epoch=step,
                         max_tokens=cfg.training.tokens_per_step)
            parts = step_flops(model.geometry, batch)
            batch = batch.to(dev)
            marks = [_mark(cuda)]
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
                hidden = model(*batch.drafter_inputs())
            marks.append(_mark(cuda))
            out = drafter_loss(model, hidden, batch, d)
            marks.append(_mark(cuda))
            out.loss.backward()
            marks.append(_mark(cuda))
            torch.nn.utils.clip_grad_norm_(params, cfg.training.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            marks.append(_mark(cuda))
            _sync(device)
            if step >= warmup:
                for name, a, b in zip(names, marks, marks[1:], strict=False):
                    totals[name] += _elapsed(a, b)
                tokens += batch.num_tokens
                flops += total_flops(parts)
                anchors += int(batch.anchors.numel())
            del hidden, out, batch
    except torch.cuda.OutOfMemoryError as e:
        opt.zero_grad(set_to_none=True)
        peak = torch.cuda.max_memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.empty_cache()
        return StepParts(label, peak_bytes=peak, oom=str(e).split("\n")[0][:160])
    timed = steps - warmup
    total_s = sum(totals.values())
    return StepParts(label, tokens / total_s, total_s / timed, {k: v / timed for k, v in totals.items()},
                     flops / total_s / 1e12, torch.cuda.max_memory_allocated() if cuda else 0, anchors / timed)


def _mark(cuda: bool):
    import torch

    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _elapsed(a, b) -> float:
    return a.elapsed_time(b) / 1e3 if hasattr(a, "elapsed_time") else b - a


def production_train(work: Path, device: str, scale: DryRun | None = None, steps: int = 5, warmup: int = 2,
                     recompute: tuple[str, ...] = RECOMPUTE, kind: str = "dflash",
                     ) -> tuple[list[StepParts], object]:
    """The production drafter's step for each activation-checkpointing choice (one model and optimizer, so the
    optimizer state is allocated once and counted in every peak)."""
    import torch

    from flashdraft.components.train.distributed import DistEnv
    from flashdraft.components.train.trainer import build_model

    folder = production_target(work / "qwen3.6-27b-head", device, *((scale.layers,) if scale else ()),
                               **(scale.target if scale else {}))
    cfg = production_config(folder, work, **(scale.overrides if scale else {}), **{"drafter.kind": kind})
    torch.manual_seed(0)
    model = build_model(cfg, DistEnv(0, 1, 0, torch.device(device)))
    prefix = "" if kind == "dflash" else f"{kind} "
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.training.lr, weight_decay=cfg.training.weight_decay)
    H, n = model.geometry.hidden_size, model.geometry.num_features
    samples = production_samples(cfg, n * H, model.geometry.vocab_size, *(scale.samples if scale else ()))
    rows = rows_of(samples, cfg.training.tokens_per_step)
    results = []
    for mode in recompute:
        model.set_activation_checkpointing(mode)
        results.append(timed_steps(model, params, opt, cfg, rows, device, steps, warmup,
                                   f"{prefix}recompute={mode}"))
    if recompute[0] == "none" and device.startswith("cuda") and kind == "dflash":  # the fused loss's gain, side by side
        from flashdraft.drafter import loss

        model.set_activation_checkpointing("none")
        fused, loss._chunk_fn = loss._chunk_fn, lambda hidden: None
        try:
            results.append(timed_steps(model, params, opt, cfg, rows, device, steps, warmup,
                                       "recompute=none, eager loss"))
        finally:
            loss._chunk_fn = fused
    return results, model


def production_samples(cfg, width: int, vocab: int, count: int = 40, lengths: tuple[int, int] = (600, 1200)):
    """Random 600-1200-token samples (prompt half, response half) with random bf16 features of `width`."""
    import torch

    from flashdraft.features.shard import Sample

    rows = random_rows(count, lengths, vocab, seed=3)
    g = torch.Generator().manual_seed(4)
    return [Sample(r.sample_id, torch.tensor(r.input_ids), torch.tensor(r.loss_mask),
                   torch.randn(len(r.input_ids), width, generator=g).to(torch.bfloat16)) for r in rows]


def production_extract(device: str, layer_ids: list[int], tokens: int = 4096, rows: int = 2,
                       budget_s: float = 45.0, **scale) -> tuple[float, float]:
    """(tokens/s, peak GiB) of the extract stage's prefill through a random bf16 Qwen3.6-27B text model cut after
    its deepest feature layer, capturing `layer_ids` (flashdraft.capture, as HFFeatureSource does); as many
    timed forwards of `rows` x `tokens` as fit in `budget_s` after one warm-up."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    from flashdraft.capture import capture_layers
    from flashdraft.target import qwen36_27b_text_config

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
            _sync(device)
            t = time.perf_counter()
            cap.forward(input_ids=ids)
            feats = cap.features()
            _sync(device)
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


def codec_decode(report: Report, device: str, tokens: int, hidden: int) -> None:
    """Section 6: the feature codecs decoded on `device` against their CPU decode."""
    from bench_codecs import gpu_decode_check

    for row in gpu_decode_check(device, tokens=tokens, hidden=hidden):
        exact = row["exact_expected"]
        report.add(f"decode/{row['codec']} on {device.split(':')[0]}",
                   float(row["mismatches"]) if exact else row["max_rel_diff"], 0.0 if exact else 1e-2,
                   f"{'values differing from' if exact else 'max rel. diff vs'} the CPU decode; "
                   f"{row['gbs']:.2f} GB/s (CPU {row['cpu_gbs']:.2f})")


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


@dataclass
class Production:
    """What section 5 measured, for the report and the calibration file."""

    train: list[StepParts]
    shape: dict            # the trainer step's geometry and batch (calibration TrainShape fields)
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
    import torch

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
    """The production rows of the report (section 5 of the module docstring)."""
    import torch

    cuda = device.startswith("cuda")
    results, model = production_train(work, device, scale, steps=3 if scale else 5, warmup=1 if scale else 2)
    cfg = production_config(work / "qwen3.6-27b-head", work, **(scale.overrides if scale else {}))
    g, d = model.geometry, cfg.drafter
    shape = {"hidden_size": g.hidden_size, "num_layers": g.num_layers, "num_heads": g.num_heads,
             "num_kv_heads": g.num_kv_heads, "head_dim": g.head_dim, "intermediate_size": g.intermediate_size,
             "vocab_size": g.draft_vocab_size or g.vocab_size, "target_vocab_size": g.vocab_size,
             "num_features": g.num_features, "block_size": g.block_size, "max_anchors": d.max_anchors,
             "tokens_per_step": cfg.training.tokens_per_step, "sliding_window": g.sliding_window,
             "strategy": "none", "world_size": 1, "autocast": "bfloat16" if cuda else "none",
             "head_dtype": "bfloat16" if cuda else "float32", "kind": "dflash",
             "conv_kernel_size": d.conv_kernel_size, "conv_group_size": d.conv_group_size,
             "selector_rank": d.selector_rank, "selector_top_k": d.selector_top_k,
             "selector_detach": d.selector_detach}
    report_steps(report, results, cuda, flops=True, row=(g.block_size, cfg.training.tokens_per_step))
    fitted = [r for r in results if not r.oom]
    best = max(fitted, key=lambda r: r.tokens_per_s) if fitted else None
    out = Production(results, shape, flops_per_token=best.tflops * 1e12 / best.tokens_per_s if best else None)
    del model
    if cuda:
        torch.cuda.empty_cache()
    dflash2, model = production_train(work, device, scale, steps=3 if scale else 5, warmup=1 if scale else 2,
                                      recompute=("mlp", "layer"), kind="dflash2")  # unsharded, none and mlp
    # ran out of memory on the H200 (and the memory model predicts it): mlp checks that, layer measures a peak
    report_steps(report, dflash2, cuda, flops=False)  # its selector's FLOPs are not in step_flops
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


def calibration(prod: Production, device: str, commit: str | None):
    """The calibration file (flashdraft/calibration.py) of what section 5 measured: the production step's best
    fitting rate and every configuration's peak, and the extraction prefill rate."""
    import datetime

    import torch

    from flashdraft.calibration import Calibration

    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name() if cuda else "cpu (dry run)"
    peak = peak_tflops(name) if cuda else None
    best = max((r for r in prod.train if not r.oom), key=lambda r: r.tokens_per_s, default=None)
    rates: dict = {}
    if best is not None:
        rates["train"] = {"tokens_per_s_per_gpu": best.tokens_per_s, "flops_per_token": prod.flops_per_token,
                          "note": f"{best.label}; step {best.step_s * 1e3:.0f} ms",
                          "shape": {**prod.shape, "anchors_per_row": best.anchors_per_row,
                                    "activation_checkpointing": best.label.split("recompute=")[1].split(",")[0]}}
    if prod.extract_tokens_per_s:
        rates["extract"] = {"tokens_per_s_per_gpu": prod.extract_tokens_per_s,
                            "note": "HF prefill with capture hooks (the extract stage's hf backend), random weights",
                            "shape": {"model": f"Qwen3.6-27B architecture, random weights, "
                                               f"{max(prod.extract_layers) + 1} layers",
                                      "layers_run": max(prod.extract_layers) + 1, "hidden_size": prod.extract_hidden,
                                      "forward_tokens": prod.extract_forward_tokens,
                                      "dtype": "bfloat16" if cuda else "float32"}}
    memory = [{"peak_bytes": r.peak_bytes, "measure": "cuda_max_allocated", "out_of_memory": bool(r.oom),
               "note": r.label + (f": {r.oom}" if r.oom else ""),
               "shape": {**prod.shape, "anchors_per_row": r.anchors_per_row or None,
                         "activation_checkpointing": r.label.split("recompute=")[1].split(",")[0]}}
              for r in prod.train if cuda]
    memory += [{"peak_bytes": r.peak_bytes, "measure": "cuda_max_allocated", "out_of_memory": bool(r.oom),
                "note": r.label + (f": {r.oom}" if r.oom else ""),
                "shape": {**prod.shape, "kind": "dflash2", "anchors_per_row": r.anchors_per_row or None,
                          "activation_checkpointing": r.label.split("recompute=")[1].split(",")[0]}}
               for r in prod.dflash2 if cuda]
    return Calibration.model_validate({
        "source": {"device": f"one {name}" + ("" if cuda else ""), "date": datetime.date.today().isoformat(),
                   "commit": commit, "command": "make gpu-check",
                   "note": "one GPU, no FSDP: the fp32 weights, gradients and AdamW state of the trainable "
                           "drafter are whole on the GPU and in every peak"},
        "gpu": {"name": name, "gpu_type": peak[0] if peak else None,
                "memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
                "bf16_tflops_peak": peak[1] if peak else None},
        "rates": rates, "train_memory": memory})


# -- the run ---------------------------------------------------------------------------------------------------


@dataclass
class Sizes:
    rows: int = 48                      # extraction/training rows of the small target
    lengths: tuple[int, int] = (200, 600)
    steps: int = 12                     # training steps compared with the CPU
    eval_prompts: int = 8
    new_tokens: int = 48


def run(work: Path, device: str, targets: tuple[TargetSpec, ...] = (TINY, WIDE), sizes: Sizes = Sizes()) -> Report:
    """Every check with `device` as the device side (CUDA for `make gpu-check`; CPU in the CPU-half tests). The
    first target gets the extraction, training-loss and evaluation checks; later ones (realistic width) extraction
    and, on CUDA, the training throughput."""
    import torch

    report = Report()
    cuda = device.startswith("cuda")
    for spec in targets:
        first = spec is targets[0]
        folder = build_target(spec, work / spec.name, device=device if cuda else "cpu",
                              dtype="float32" if first else "bfloat16")
        # two draft layers, the second sliding (window 48 < the rows): flex's windowed block mask meets dense SDPA's
        cfg = run_config(folder, spec, work, drafter_layers=2, sliding_window=48,
                         layer_types=["full_attention", "sliding_attention"])
        rows = random_rows(sizes.rows if first else 12, sizes.lengths, spec.vocab, seed=1)
        ref, ref_tps = extract(cfg, rows, "cpu")
        got, got_tps = extract(cfg, rows, device)
        errs = layer_errors(ref, got)
        for lid, e in zip(cfg.layer_ids(), errs, strict=True):
            report.add(f"extract/{spec.name}/layer{lid}", e, EXTRACT_TOL, "rel. error vs CPU fp32")
        report.add(f"extract/{spec.name} tokens/s", got_tps, None, f"{device} (CPU fp32: {ref_tps:,.0f})")
        samples = samples_from(rows, ref)
        if first:
            groups = rows_of(samples, cfg.training.tokens_per_step)
            steps = sizes.steps
            cpu_losses, _, _ = train(cfg, groups, "cpu", steps)
            dev_losses, _, trained = train(cfg, groups, device, steps)
            gaps = loss_gaps(cpu_losses, dev_losses)
            worst = max(range(steps), key=lambda k: gaps[k])
            report.add(f"train/{spec.name} loss gap", gaps[worst], LOSS_TOL,
                       f"worst of {steps} steps (step {worst}: {dev_losses[worst]:.4f} vs CPU {cpu_losses[worst]:.4f})")
            host, deferred = q4_groups(groups, len(cfg.layer_ids()))
            q4_host, _, _ = train(cfg, host, device, 2)
            q4_dev, _, _ = train(cfg, deferred, device, 2)
            report.add(f"train/{spec.name} q4 decoded on {device.split(':')[0]}", max(loss_gaps(q4_host, q4_dev)),
                       Q4_DEFER_TOL, "loss gap of 2 steps on q4 features the trainer decoded on the device "
                       "(training.feature_decode=device) vs decoded on the host")
            bad, ties, tau = evaluate(cfg, trained, rows[: sizes.eval_prompts], device, sizes.new_tokens)
            report.add(f"evaluate/{spec.name} lossless", float(len(bad)), 0.0,
                       f"mismatching prompts ({len(ties)} numerical ties); tau {tau}")
        elif cuda:
            wide = run_config(folder, spec, work, drafter_layers=1, block_size=16, max_anchors=128,
                              tokens_per_step=8192, lr=1e-4, sliding_window=2048)  # the production window
            rows_w = random_rows(16, (1500, 2500), spec.vocab, seed=2)
            feats_w, tps = extract(wide, rows_w, device)
            report.add(f"extract/{spec.name} tokens/s, long rows", tps, None,
                       f"{sum(len(r.input_ids) for r in rows_w):,} tokens, forward_tokens {wide.features.batch_tokens}")
            t = throughput(wide, samples_from(rows_w, feats_w), device, steps=8)
            report.add(f"train/{spec.name} tokens/s", t.tokens_per_s, None,
                       f"~{t.anchors_per_row:.0f} anchors x 16 per {wide.training.tokens_per_step}-token row, "
                       f"step {t.step_s * 1e3:.0f} ms")
            peak = peak_tflops(torch.cuda.get_device_name())
            measured = matmul_tflops(device)
            report.add(f"train/{spec.name} TFLOP/s", t.tflops, None,
                       (f"{t.tflops / peak[1]:.1%} of {peak[0]} bf16 peak {peak[1]:.0f}; " if peak else "")
                       + f"{t.tflops / measured:.1%} of a bf16 matmul here ({measured:.0f})")
            report.add(f"train/{spec.name} loss finite", 0.0 if all(map(math.isfinite, t.losses)) else math.inf,
                       0.0, f"losses {t.losses[0]:.3f} -> {t.losses[-1]:.3f}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="the device side (cuda; cpu only to exercise the script)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="tiny target only, few rows and steps")
    parser.add_argument("--cpu-threads", type=int, default=None, help="torch CPU threads for the CPU reference")
    parser.add_argument("--production", action=argparse.BooleanOptionalAction, default=None,
                        help="section 5, the production shapes (default: on with CUDA; on CPU a toy-width dry run)")
    parser.add_argument("--only-production", action="store_true", help="skip sections 1-4")
    parser.add_argument("--json", default=None, help="write the calibration file (flashdraft plan --calibrate) here")
    parser.add_argument("--commit", default=os.environ.get("FLASHDRAFT_COMMIT"),
                        help="the flashdraft commit, recorded in the calibration file (default $FLASHDRAFT_COMMIT)")
    args = parser.parse_args(argv)
    bootstrap()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: no CUDA device visible to torch", file=sys.stderr)
        return 2
    start = time.perf_counter()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    quick = Sizes(rows=8, lengths=(48, 160), steps=4, eval_prompts=4, new_tokens=16)
    cuda = args.device.startswith("cuda")
    report = Report() if args.only_production else run(work, args.device, (TINY,) if args.quick else (TINY, WIDE),
                                                       quick if args.quick else Sizes())
    if args.production if args.production is not None else cuda:
        prod = production(report, work, args.device, None if cuda else DryRun())
        if args.json:
            from flashdraft.calibration import save_calibration

            print(f"calibration: {save_calibration(calibration(prod, args.device, args.commit), args.json)}")
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"\ngpu-check on {name} (torch {torch.__version__}), {time.perf_counter() - start:.0f} s\n")
    print(report.table())
    print("\nPASS" if report.ok else "\nFAIL")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
