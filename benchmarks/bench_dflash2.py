"""DFlash vs DFlash2 at local scale, side by side in one run: the same features, the same steps (rows, anchors,
order), the same seed; held-out per-position acceptance and tau at equal steps and at equal training time, and the
drafting cost of one cycle.

Data and recipe: the `make run-local` run (preset smollm2-local: SmolLM2-135M target, its 4096-token draft
vocabulary). DFlash2 cannot use a reduced vocabulary (its codebooks and candidates are target ids; vLLM's code
too), so it trains over the full 49,152-token head; "dflash full-vocab" is the control that separates the
vocabulary's cost from DFlash2's own. The two selector objectives (docs/dflash2.md) are both run:
`gold_topk` (speculators' reconstruction) and `strict_topk` (SpecForge's, with warm-up 4% and ramp 10%).

Held-out tau is offline tau (bench_train.block_metrics): for every eligible held-out anchor the drafted block
(argmax, or the selector's greedy walk) against the target's own greedy continuation; 1 + mean accepted run.
Drafting cost: `DraftSession.propose` on a cached context of up to 256 tokens, the variants interleaved, median of N.

    .venv/bin/python benchmarks/bench_dflash2.py [--curve-steps 300] [--every 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train as bt  # noqa: E402  (the training bench's plan, curves and metrics)

VARIANTS = {
    "dflash": [],
    "dflash full-vocab": ["drafter.draft_vocab_size=null"],
    "dflash2 gold_topk": ["drafter.draft_vocab_size=null", "drafter.kind=dflash2"],
    "dflash2 strict_topk": ["drafter.draft_vocab_size=null", "drafter.kind=dflash2",
                            "drafter.selector_objective=strict_topk", "drafter.selector_warmup=0.04",
                            "drafter.selector_ramp=0.1"],
}


def drafting_cost(models: dict, sample: dict, rounds: int) -> dict:
    """Median ms of one `propose` per variant on the same cached context, variants interleaved round by round."""
    import torch

    ctx = min(256, int(sample["input_ids"].numel()) - 1)
    feats, anchor = sample["features"][:ctx].float(), int(sample["input_ids"][ctx])
    sessions = {}
    for name, m in models.items():
        m.eval()
        s = m.new_session()
        s.extend(feats)
        s.propose(anchor)  # warm-up
        sessions[name] = s
    times = {name: [] for name in models}
    with torch.no_grad():
        for _ in range(rounds):
            for name, s in sessions.items():
                t0 = time.perf_counter()
                s.propose(anchor)
                times[name].append(time.perf_counter() - t0)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="smollm2-local")
    ap.add_argument("--set", action="append", default=[], help="config overrides for the data run and all variants "
                    "(e.g. storage.root=... run_id=... to reuse a run's features)")
    ap.add_argument("--curve-steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--heldout", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=30, help="drafting-cost repetitions per variant")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--reuse", action="store_true", help="read the run's committed features as they are (skip the "
                    "prep/generate/extract resume check)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()


    from flashdraft.config import load_config
    from flashdraft.target.model import cache_dir

    base = [f"storage.root=file://{cache_dir() / 'bench' / 'runs'}", *args.set]
    data_cfg = load_config(preset=args.preset, overrides=base)
    if not args.reuse:
        bt.ensure_features(data_cfg, None, args.preset, base)
    samples = bt.load_run_samples(data_cfg)
    train, held = samples[:-args.heldout], samples[-args.heldout:]
    print(f"data: run {data_cfg.run_id}, {len(train)} train / {len(held)} held-out samples; "
          f"{bt.THREADS} threads, load average {os.getloadavg()[0]:.1f} (timings are under this load)", flush=True)
    results, models = {}, {}
    for name in args.variants:
        cfg = load_config(preset=args.preset, overrides=base + VARIANTS[name])
        plan = bt.build_plan(cfg, train, held, args.curve_steps, 1)
        plan["points"] = bt.curve_points(len(plan["steps"]), args.every)
        out = bt.run_flashdraft_curve(cfg, train, held, plan, name)
        models[name] = out.pop("model")
        results[name] = out
    cost = drafting_cost(models, held[0], args.rounds)
    load = os.getloadavg()[0]

    names = list(results)
    print(f"\nHeld-out offline tau and slot-1/last-slot acceptance at equal steps (load average {load:.1f})")
    print(f"{'step':>5} | " + " | ".join(f"{n:>24}" for n in names))
    for k, point in enumerate(results[names[0]]["curve"]):
        cells = []
        for n in names:
            c = results[n]["curve"][k]
            cells.append(f"tau {c['tau']:.3f} a1 {c['acc_pos'][0]:.2f} a7 {c['acc_pos'][-1]:.2f}")
        print(f"{point['step']:>5} | " + " | ".join(f"{c:>24}" for c in cells))
    print("\nTraining seconds to the last step (under load) and tau at equal training time (the fastest variant's "
          "total):")
    budget = min(results[n]["curve"][-1]["train_s"] for n in names)
    equal_time = {}
    for n in names:
        reached = [c for c in results[n]["curve"] if c["train_s"] <= budget + 1e-9]
        c = reached[-1]
        equal_time[n] = {"step": c["step"], "tau": c["tau"]}
        print(f"  {n:<22} total {results[n]['curve'][-1]['train_s']:>7.1f} s   at {budget:.0f} s: step {c['step']:>4} "
              f"tau {c['tau']:.3f}")
    print("\nDrafting cost per cycle (one propose on the same cached context, median ms, interleaved):")
    ref = cost.get("dflash full-vocab") or next(iter(cost.values()))
    for n, ms in cost.items():
        print(f"  {n:<22} {ms:>7.2f} ms   x{ms / ref:.2f} of dflash full-vocab")
    summary = {"load_avg": os.getloadavg(), "threads": bt.THREADS, "curves": results, "equal_time": equal_time,
               "drafting_ms": cost}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
