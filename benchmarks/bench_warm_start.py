"""Training on from an existing drafter, on SmolLM2 (the embedded target): the fine-tuning learning rate and warmup,
and the drafter as is / trained on / from scratch, side by side in one run.

A parent drafter is trained on mix A (`builtin:demo`, N steps from `drafter.init: target`). Mix B is HumanEval's
problems as chat requests: prep, generate and extract run once, then every row trains on mix B's same committed
features (a copy of its store each) and evaluates the same held-out prompts:
* as is: `drafter.init: pretrained` + `training.max_steps: 0` (evaluate only);
* trained on, N/4 steps, for every (learning rate, warmup ratio) of the grid;
* from scratch (`init: target`), N steps at the preset's learning rate.
Evaluate is the real speculative decode (greedy, lossless checked); "probe" is the trainer's held-out curve (offline
tau on held-out extracted samples, noisier). Stages run through the runner (`run_task`), as the pipeline runs them.
Wall times on a shared 2-core machine are noisy: the load average is printed beside them.

    python benchmarks/bench_warm_start.py [--steps 400] [--lrs 1e-3,3e-3,6e-3] [--warmups 0.04,0.2]
        [--work DIR] [--out table.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flashdraft.components.evaluate.suites import HUMANEVAL_REQUEST, humaneval_rows
from flashdraft.config import RunConfig, load_config
from flashdraft.run.runner import run_task

PRESET = "smollm2-local"
# Both mixes: one shard, 96-token replies, 16 held-out prompts decoded 48 tokens each, 8 samples for the probe; the
# step count is training.max_steps (epochs only bound it). No untrained baseline: the parent row is the baseline.
COMMON = {"data.num_shards": 1, "data.eval_count": 16, "data.max_response_tokens": 96, "eval.num_prompts": 16,
          "eval.max_new_tokens": 48, "eval.suites": ["heldout"], "training.heldout_samples": 8,
          "training.epochs": 1000, "eval.baseline_prompts": 0}
MIX_A_SAMPLES, MIX_B_SAMPLES = 112, 72  # train + eval prompts: 88 / 48 trained on


@dataclass(frozen=True)
class Row:
    label: str
    lr: float | None
    warmup: float | None
    steps: int
    evaluate_tau: float
    probe: str          # the held-out curve's first -> last offline tau
    train_s: float
    evaluate_s: float


def config(root: Path, sets: dict) -> RunConfig:
    return load_config(preset=PRESET, overrides={"storage.root": f"file://{root}/runs", **COMMON, **sets})


def timed(cfg: RunConfig, stage: str, shard: int | None = None):
    t0 = time.monotonic()
    summary = run_task(cfg, stage, shard)
    return summary, round(time.monotonic() - t0, 1)


def make_data(cfg: RunConfig) -> dict[str, float]:
    """prep, generate and extract of a one-shard run; their wall seconds."""
    _, prep = timed(cfg, "prep")
    _, gen = timed(cfg, "generate", 0)
    _, ext = timed(cfg, "extract", 0)
    return {"prep": prep, "generate": gen, "extract": ext}


def train_and_evaluate(label: str, root: Path, data_root: Path, sets: dict, steps: int) -> Row:
    """Mix B's committed data copied under `root`, then train (unless steps == 0) and evaluate."""
    shutil.copytree(data_root / "runs", root / "runs")
    cfg = config(root, {**sets, "training.max_steps": steps, "training.heldout_every": max(steps // 4, 1)})
    train_s, probe = 0.0, "-"
    if steps:
        summary, train_s = timed(cfg, "train")
        taus = [p["tau"] for p in summary.heldout if p.get("tau") is not None]
        probe = f"{taus[0]:.2f} -> {taus[-1]:.2f}" if taus else "-"
    metrics, eval_s = timed(cfg, "evaluate")
    assert metrics.lossless is None or metrics.lossless.passed, f"{label}: not lossless"
    row = Row(label, cfg.training.lr if steps else None, cfg.training.warmup_ratio if steps else None, steps,
              round(metrics.drafter.tau, 3), probe, train_s, eval_s)
    print(f"  {row}  (load {os.getloadavg()[0]:.1f})", flush=True)
    return row


def table(rows: list[Row], data_s: dict[str, dict[str, float]], parent_train_s: float, steps: int) -> str:
    lines = ["| on mix B | lr | warmup | steps | held-out tau (evaluate) | probe tau | train s | evaluate s |",
             "|---|---:|---:|---:|---:|---|---:|---:|"]
    best = max((r for r in rows if r.label.startswith("trained on")), key=lambda r: r.evaluate_tau)
    for r in rows:
        tau = f"**{r.evaluate_tau:.3f}**" if r is best else f"{r.evaluate_tau:.3f}"
        lines.append(f"| {r.label} | {r.lr if r.lr is not None else '-'} | {r.warmup if r.warmup is not None else '-'}"
                     f" | {r.steps} | {tau} | {r.probe} | {r.train_s:.0f} | {r.evaluate_s:.0f} |")
    lines.append(f"\nN = {steps}. Mix A (parent): {MIX_A_SAMPLES} builtin:demo prompts, data "
                 f"{json.dumps(data_s['A'])} s, parent training {parent_train_s:.0f} s; mix B: {MIX_B_SAMPLES} "
                 f"HumanEval requests, data {json.dumps(data_s['B'])} s. Host: {os.cpu_count()} CPUs, load "
                 f"{os.getloadavg()[0]:.1f} at the end.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400, help="N: the parent's and the from-scratch drafter's steps")
    ap.add_argument("--lrs", default="1e-3,3e-3,6e-3", help="learning rates of the trained-on rows")
    ap.add_argument("--warmups", default="0.04,0.2", help="warmup ratios of the trained-on rows")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-warm-start-"))
    steps = args.steps

    print(f"mix A: {MIX_A_SAMPLES} demo prompts, parent trained {steps} steps ({work})", flush=True)
    a_cfg = config(work / "A", {"run_id": "mix-a", "data.max_samples": MIX_A_SAMPLES, "training.max_steps": steps,
                                "training.heldout_every": max(steps // 4, 1)})
    data_s = {"A": make_data(a_cfg)}
    _, parent_train_s = timed(a_cfg, "train")
    parent = f"file://{work}/A/runs/mix-a/checkpoints/"

    print(f"mix B: {MIX_B_SAMPLES} HumanEval requests", flush=True)
    prompts = work / "mix-b.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": HUMANEVAL_REQUEST.format(prompt=r["prompt"])}) + "\n"
                               for r in humaneval_rows()))
    b_sets = {"run_id": "mix-b", "data.sources": [{"uri": str(prompts)}], "data.max_samples": MIX_B_SAMPLES}
    data_s["B"] = make_data(config(work / "B", b_sets))

    on = {**b_sets, "drafter.init": "pretrained", "drafter.init_from": parent}
    rows = [train_and_evaluate("as is (evaluate only)", work / "as-is", work / "B", on, 0)]
    for lr in (float(x) for x in args.lrs.split(",")):
        for warmup in (float(x) for x in args.warmups.split(",")):
            rows.append(train_and_evaluate(f"trained on, lr {lr:g}, warmup {warmup:g}", work / f"on-{lr:g}-{warmup:g}",
                                           work / "B", {**on, "training.lr": lr, "training.warmup_ratio": warmup},
                                           steps // 4))
    rows.append(train_and_evaluate("from scratch (init: target)", work / "scratch", work / "B", b_sets, steps))
    text = table(rows, data_s, parent_train_s, steps)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
