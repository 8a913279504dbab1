"""What a speculative cycle costs on this machine, side by side in one run: the target's cached forward over
1..B tokens (ms, and ratio to its one-token step) and the drafter's proposal of 1..B-1 drafts, with the stock
CPU kernels and with the target's linear layers on oneDNN-packed weights (components/evaluate/cpu_kernels.py).

Both target copies load the same checkpoint; rounds alternate between them so load on a shared host hits both
alike, and every figure is the minimum over all rounds and reps: the least-disturbed run, since load on a shared
host only ever adds time. The drafter is untrained (same shape as
a trained one, so the same cost). The last column pair is the expected speedup of each k with the acceptance per
position given by --acceptance (default: issue 46's held-out figures for the smollm2-local drafter), the curve
evaluate draws with its own measured acceptance (components/evaluate/draft_length.py).

    python benchmarks/bench_verify.py [--preset smollm2-local] [--prompt-tokens 200] [--rounds 6] [--reps 3]
        [--acceptance 0.42,0.21,0.12,0.05,0.02,0.02,0.01] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from flashdraft.components.evaluate.cpu_kernels import pack_linears, packed_kernels_available
from flashdraft.components.evaluate.draft_length import CycleCosts, draft_length_curve, measure_cycle_costs
from flashdraft.components.evaluate.prompts import encode_chat
from flashdraft.components.prep.demo import demo_rows
from flashdraft.config import load_config
from flashdraft.drafter.persistence import build_drafter
from flashdraft.target.model import load_causal_lm, load_hf_config, load_tokenizer, set_cpu_threads

ISSUE_46_ACCEPTANCE = "0.42,0.21,0.12,0.05,0.02,0.02,0.01"


def _prompt(tok, tokens: int) -> list[int]:
    """Demo chat turns joined until the rendered prompt reaches `tokens` ids, cut to exactly that many."""
    ids: list[int] = []
    for i, row in enumerate(demo_rows()):
        ids += encode_chat(tok, [next(m for m in row["messages"] if m["role"] == "user")], f"demo row {i}")
        if len(ids) >= tokens:
            return ids[:tokens]
    return ids


def _min_costs(runs: list[CycleCosts]) -> CycleCosts:
    return CycleCosts(min(r.step_ms for r in runs),
                      [min(col) for col in zip(*(r.verify_ms for r in runs), strict=True)],
                      [min(col) for col in zip(*(r.draft_ms for r in runs), strict=True)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smollm2-local")
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--acceptance", default=ISSUE_46_ACCEPTANCE)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: CPU seconds of all threads (process_time), steadier than wall time on a loaded host")
    args = ap.parse_args()
    cfg = load_config(preset=args.preset)
    set_cpu_threads(cfg)
    tok = load_tokenizer(cfg.target)
    models = {"stock": load_causal_lm(cfg.target).eval()}
    if packed_kernels_available(models["stock"]):
        models["packed"] = load_causal_lm(cfg.target).eval()
        pack_linears(models["packed"])
    drafter = build_drafter(cfg, load_hf_config(cfg.target), seed=cfg.training.seed, tokenizer=tok).eval()
    prompt, block = _prompt(tok, args.prompt_tokens), cfg.drafter.block_size
    runs: dict[str, list[CycleCosts]] = {name: [] for name in models}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for name, model in models.items():
            runs[name].append(measure_cycle_costs(model, drafter, prompt, cfg.layer_ids(), block, args.reps,
                                                     statistic=min, clock=clock))
    costs = {name: _min_costs(r) for name, r in runs.items()}
    acceptance = [float(a) for a in args.acceptance.split(",")]
    print(f"\n{args.preset}: {len(prompt)}-token prompt, block {block}, {torch.get_num_threads()} threads, "
          f"host load (1 min) {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
          f"minimum of {args.rounds} rounds x {args.reps} reps, {args.clock} clock")
    base = costs["stock"].step_ms
    head = "".join(f" {n + ' ms':>10s} {'/1 tok':>7s} {'/stock 1':>8s}" for n in costs)
    print(f"{'tokens':>6s}{head} {'draft ms':>9s}" + "".join(f" {'exp. ' + n:>13s}" for n in costs))
    curves = {n: draft_length_curve(c, acceptance) for n, c in costs.items()}
    for width in range(1, block + 1):
        cells = ""
        for c in costs.values():
            ms = c.step_ms if width == 1 else c.verify_ms[width - 2]
            cells += f" {ms:10.1f} {ms / c.step_ms:7.2f} {ms / base:8.2f}"
        k = width - 1
        draft = f"{costs['stock'].draft_ms[k - 1]:9.1f}" if k else f"{'-':>9s}"
        exp = "".join(f" {curves[n][k - 1].expected_speedup or 0:13.2f}" if k else f" {'-':>13s}" for n in costs)
        print(f"{width:6d}{cells} {draft}{exp}")
    print("tokens: the target forward's width (k drafts are verified by a forward over k + 1); draft ms: the "
          "drafter proposing k = tokens - 1; exp.: expected speedup of k over the same kernels' plain decode")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
