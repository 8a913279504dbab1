"""Predicted vs measured peak memory of the real trainer step on CPU, at scaled shapes (issue 23 item 3).

Each shape runs in a fresh subprocess: it builds a `DFlashDrafter` of that geometry with random frozen embedding
and LM head (the memory does not depend on weight values), packs random samples, and runs 3 optimizer steps the way
`components.train.trainer.Trainer.step` does (`micro_step`: pack, forward, the fused DFlash loss, backward; then
grad-norm clip, the trainer's optimizers (`build_optimizers`: AdamW, or Muon on the matrices and AdamW on the rest),
`zero_grad(set_to_none=True)`). Measured = the process's peak RSS (`ru_maxrss`) minus its RSS
just before the model is built (after torch and flashdraft are imported and warmed up): on CPU torch allocates
through malloc, with glibc's mmap threshold pinned at 128 KiB (`MALLOC_MMAP_THRESHOLD_`) so that freed tensors go
back to the OS and RSS tracks live tensors. Predicted = components/plan/memory.py's `trainer_memory` on the CPU
device terms (fp32, no autocast, the dense SDPA mask) at the anchors that row actually drew. RSS is not
load-dependent: the figures hold on a shared machine.

    .venv/bin/python benchmarks/bench_memory.py [--json out.json] [--shapes a,b]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = 2  # the second step runs with AdamW's moments allocated (the steady state)

# Scaled shapes, each led by a different term (dense mask, optimizer state, depth, vocabulary, anchors); sized so a
# step is ~100 GFLOP (dense CPU attention costs positions x keys) and a process stays well under 4 GiB.
SHAPES: dict[str, dict] = {
    "base": dict(hidden=256, layers=2, heads=2, kv_heads=1, head_dim=32, inter=512, vocab=8192, tokens=2048,
                 anchors=64, sample_len=512, window=None),
    "wide": dict(hidden=1536, layers=1, heads=4, kv_heads=1, head_dim=64, inter=3072, vocab=8192, tokens=1024,
                 anchors=16, sample_len=512, window=None),
    "deep": dict(hidden=256, layers=6, heads=2, kv_heads=1, head_dim=32, inter=512, vocab=4096, tokens=4096,
                 anchors=16, sample_len=1024, window=128),
    "vocab": dict(hidden=256, layers=1, heads=2, kv_heads=1, head_dim=32, inter=512, vocab=151936, tokens=1024,
                  anchors=16, sample_len=512, window=None),
    "anchors": dict(hidden=128, layers=1, heads=2, kv_heads=1, head_dim=32, inter=384, vocab=4096, tokens=1024,
                    anchors=512, sample_len=1024, window=256),
    # DFlash2 (drafter.kind=dflash2): base's geometry plus block convolutions (groups of 64) and the candidate
    # selector at its defaults (rank 256, top-16)
    "dflash2": dict(hidden=256, layers=2, heads=2, kv_heads=1, head_dim=32, inter=512, vocab=8192, tokens=2048,
                    anchors=64, sample_len=512, window=None, kind="dflash2", conv_group=64),
    # training.optimizer=muon on wide's geometry, where the optimizer state leads: Muon's one fp32 buffer a matrix
    "muon": dict(hidden=1536, layers=1, heads=4, kv_heads=1, head_dim=64, inter=3072, vocab=8192, tokens=1024,
                 anchors=16, sample_len=512, window=None, optimizer="muon"),
}
SMALL = dict(hidden=64, layers=1, heads=2, kv_heads=1, head_dim=32, inter=128, vocab=1024, tokens=256,
             anchors=8, sample_len=128, window=None)
SMALL_DFLASH2 = {**SMALL, "kind": "dflash2", "conv_group": 16}


def run_config(spec: dict):
    from flashdraft.config import validate_config

    return validate_config({
        "target": {"model": "bench-memory", "source": "tiny", "num_layers": 8, "hidden_size": spec["hidden"]},
        "drafter": {"num_layers": spec["layers"], "block_size": 16, "max_anchors": spec["anchors"],
                    "num_heads": spec["heads"], "num_kv_heads": spec["kv_heads"], "head_dim": spec["head_dim"],
                    "intermediate_size": spec["inter"], "sliding_window": spec["window"],
                    "kind": spec.get("kind", "dflash"), "conv_group_size": spec.get("conv_group", 64)},
        "training": {"tokens_per_step": spec["tokens"], "strategy": "ddp",
                     "optimizer": spec.get("optimizer", "adamw")}}, source="bench_memory")


def shape_of(spec: dict, anchors_per_row: float):
    from flashdraft.perf.calibration import TrainShape

    return TrainShape(hidden_size=spec["hidden"], num_layers=spec["layers"], num_heads=spec["heads"],
                      num_kv_heads=spec["kv_heads"], head_dim=spec["head_dim"], intermediate_size=spec["inter"],
                      vocab_size=spec["vocab"], block_size=16, max_anchors=spec["anchors"],
                      tokens_per_step=spec["tokens"], anchors_per_row=anchors_per_row,
                      sliding_window=spec["window"], strategy="none", autocast="none", head_dtype="float32",
                      kind=spec.get("kind", "dflash"), conv_group_size=spec.get("conv_group", 64),
                      optimizer=spec.get("optimizer", "adamw"))


def samples(spec: dict, seed: int = 0):
    """Random samples filling one row: a quarter prompt, the rest response (loss_mask 1)."""
    import torch

    from flashdraft.features.shard import Sample

    gen = torch.Generator().manual_seed(seed)
    T, n = spec["sample_len"], spec["tokens"] // spec["sample_len"]
    out = []
    for i in range(n):
        mask = torch.zeros(T, dtype=torch.bool)
        mask[T // 4:] = True
        out.append(Sample(f"s{i}", torch.randint(0, spec["vocab"], (T,), generator=gen), mask,
                          torch.randn(T, 5 * spec["hidden"], generator=gen).bfloat16()))
    return out


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(name: str, spec: dict) -> dict:
    """One shape in this (fresh) process: the trainer's step STEPS times; peak RSS over the pre-build baseline."""
    import torch

    torch.set_num_threads(1)
    if name != "small":  # the runtime's own pages (kernels, autograd engine) load on a tiny step first
        steps(SMALL)
    base = rss()
    return {"shape": name, **steps(spec), "measured_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            - base}


def steps(spec: dict) -> dict:
    """Build the drafter and its optimizer for `spec`, run STEPS trainer steps; the anchors the row drew."""
    from dataclasses import replace

    import torch

    from flashdraft.components.train.optim import build_optimizers
    from flashdraft.components.train.trainer import micro_step
    from flashdraft.drafter.batch import pack
    from flashdraft.drafter.dflash_drafter import DFlashDrafter
    from flashdraft.drafter.geometry import DrafterGeometry

    cfg = run_config(spec)
    H, V, L = spec["hidden"], spec["vocab"], spec["layers"]
    g = DrafterGeometry(hidden_size=H, num_heads=spec["heads"], num_kv_heads=spec["kv_heads"],
                        head_dim=spec["head_dim"], intermediate_size=spec["inter"], rope_theta=1e6, rms_norm_eps=1e-6,
                        vocab_size=V, num_layers=L, block_size=16, target_layer_ids=[1, 2, 3, 4, 5],
                        num_target_layers=8, mask_token_id=0,
                        layer_types=["sliding_attention" if spec["window"] else "full_attention"] * L,
                        sliding_window=spec["window"])
    if spec.get("kind") == "dflash2":  # the config's defaults, as build_drafter sets them
        d = cfg.drafter
        g = replace(g, kind="dflash2", conv_kernel_size=d.conv_kernel_size, conv_group_size=d.conv_group_size,
                    selector_rank=d.selector_rank, selector_top_k=d.selector_top_k)
    model = DFlashDrafter(g, attn_impl="auto")
    model.set_frozen(torch.randn(V, H) * 0.02, torch.randn(V, H) * 0.02)
    model.init_weights(0)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizers(model, params, cfg.training.optimizer, 1e-4, cfg.training.weight_decay)
    rows = samples(spec)
    anchors = int(pack(rows, 16, spec["anchors"], seed=0, epoch=0, max_tokens=spec["tokens"]).anchors.numel())
    model.train()
    for _ in range(STEPS):  # Trainer.step with grad_accum 1
        micro_step(model, model, rows, cfg, 0, torch.device("cpu"), 1.0, sync=True)
        torch.nn.utils.clip_grad_norm_(params, cfg.training.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
    return {"anchors_per_row": anchors, "params": sum(p.numel() for p in params)}


def measure(name: str, spec: dict) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--child", name, "--spec", json.dumps(spec)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"bench_memory shape {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(name: str, spec: dict) -> dict:
    """Measure `spec` in a fresh process and put the model's prediction beside it."""
    from flashdraft.components.plan.memory import trainer_memory

    row = measure(name, spec)
    est = trainer_memory(shape_of(spec, row["anchors_per_row"]), "cpu")
    row.update(predicted_bytes=est.peak_bytes, phase=est.phase, parts=est.parts,
               ratio=est.peak_bytes / row["measured_bytes"])
    return row


def table(rows: list[dict]) -> str:
    lines = ["| shape | width x layers | vocab | tokens | anchors/row | predicted | measured (RSS) | pred/meas | "
             "peak set by |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        s = SHAPES.get(r["shape"], SMALL_DFLASH2 if r["shape"] == "small-dflash2" else SMALL)
        lines.append(f"| {r['shape']} | {s['hidden']} x {s['layers']} | {s['vocab']:,} | {s['tokens']:,} | "
                     f"{r['anchors_per_row']:,} | {r['predicted_bytes'] / 2**20:,.0f} MiB | "
                     f"{r['measured_bytes'] / 2**20:,.0f} MiB | {r['ratio']:.2f} | {r['phase']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ", ".join(SHAPES))
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.spec))))
        return 0
    rows = []
    for name in args.shapes.split(","):
        rows.append(compare(name, SHAPES[name]))
        r = rows[-1]
        print(f"{name}: predicted {r['predicted_bytes'] / 2**20:,.0f} MiB, measured {r['measured_bytes'] / 2**20:,.0f}"
              f" MiB ({r['ratio']:.2f}), peak phase {r['phase']}", file=sys.stderr, flush=True)
    print(table(rows))
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"\nworst |predicted/measured - 1| = {worst:.1%} (goal <= 15%)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
