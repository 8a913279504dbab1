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

The CPU half (reference computations, comparisons, the table and the exit status) runs in CI: tests/unit/
test_gpu_check.py, with the "device" side on CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
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
TIE_MARGIN = 1e-3    # fp32 target: a divergence where its top-2 logits are closer than this is a numerical tie


def bootstrap() -> None:
    """Make the repository importable as installed (flashdraft, flashdraft.components) with the carried wheels."""
    from importlib import metadata

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    wanted = []
    for wheel in sorted(WHEELS.glob("*.whl")):
        dist, version = wheel.name.split("-")[:2]
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wanted.append(wheel)
    if wanted:
        site = Path(tempfile.mkdtemp(prefix="gpu-check-wheels-"))
        for wheel in wanted:
            zipfile.ZipFile(wheel).extractall(site)
        sys.path.insert(0, str(site))
        print(f"gpu-check: using carried {', '.join(w.name.split('-')[0] for w in wanted)}", file=sys.stderr)
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
    flops = sum(sum(step_flops(model.geometry, b).values()) for b in batches)
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
    only), once. The matmul part equals torch's FlopCounterMode on a real step (tests/unit/test_gpu_check.py).
    Returns {"matmul": projections, MLP and head, "attention": ...}."""
    from flashdraft.drafter.attention import dense_mask

    S, N, B = batch.num_tokens, int(batch.anchors.numel()), batch.block_size
    H, hd, nh, kv, inter = g.hidden_size, g.head_dim, g.num_heads, g.num_kv_heads, g.intermediate_size
    fc, ctx_kv = S * 2 * g.num_features * H * H, S * g.num_layers * 4 * H * kv * hd
    per_block_token = g.num_layers * (4 * H * nh * hd + 4 * H * kv * hd + 6 * H * inter)
    layout = batch.layout()
    pairs = sum(int(dense_mask(layout, g.window(i)).sum()) for i in range(g.num_layers))
    attn = 4 * hd * nh * pairs
    head = 2 * g.vocab_size * H * int(batch.valid.sum())
    return {"matmul": 2 * fc + 3 * (ctx_kv + N * B * per_block_token) + 2 * head, "attention": 3 * attn}


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
    report = run(work, args.device, (TINY,) if args.quick else (TINY, WIDE), quick if args.quick else Sizes())
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"\ngpu-check on {name} (torch {torch.__version__}), {time.perf_counter() - start:.0f} s\n")
    print(report.table())
    print("\nPASS" if report.ok else "\nFAIL")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
