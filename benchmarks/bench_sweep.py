"""Extract once, train many, measured on SmolLM2 (issue 50; docs/training.md "a sweep against separate runs"):
three variants (DFlash at learning rates 1e-3 and 3e-3, DFlash2) as one `flashdraft sweep` (one generation and
extraction, three trainings) against three separate `flashdraft run-local` runs (three of each), side by side.

Each arm is the documented command, timed as a subprocess, in its own folder. Every run decodes the full block
(`eval.num_draft_tokens=7`), so a variant's tau beside its separate run's compares drafters trained on the same
greedy replies (generate reproduces them exactly at temperature 0), not draft lengths a timing picked.

    python benchmarks/bench_sweep.py [--work DIR] [--out table.md] [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from local_runs import RunFigures, flashdraft, host_line, run_figures

PRESET = "smollm2-local"
# Each variant: its name in the sweep (the grid names a variant after its values) and its overrides. DFlash2 drafts
# over the full vocabulary (its codebooks are target ids), so the preset's draft vocabulary is unset.
VARIANTS = {"dflash2": ("dflash2", {"drafter.kind": "dflash2", "drafter.draft_vocab_size": "null"}),
            "lr1e-3": ("lr0.001", {"training.lr": "1.0e-3"}), "lr3e-3": ("lr0.003", {"training.lr": "3.0e-3"})}
DFLASH2_YAML = "variants: [{name: dflash2, overrides: {drafter.kind: dflash2, drafter.draft_vocab_size: null}}]\n"


def sets_args(sets: dict[str, str]) -> list[str]:
    return [a for key, value in sets.items() for a in ("--set", f"{key}={value}")]


def sweep_arm(work: Path, common: dict[str, str]) -> tuple[float, RunFigures, dict[str, RunFigures]]:
    """The sweep: its wall seconds, the base run's figures (generate, extract) and each variant's."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "dflash2.yaml").write_text(DFLASH2_YAML)
    wall = flashdraft(["sweep", "--preset", PRESET, "--set", "run_id=sw", *sets_args(common),
                       "--grid", "training.lr=1.0e-3,3.0e-3", "--variants", "dflash2.yaml"], work)
    base = run_figures(work / "runs", "sw", evaluated=False)
    return wall, base, {name: run_figures(work / "runs", f"sw-{swept}") for name, (swept, _) in VARIANTS.items()}


def separate_arm(work: Path, common: dict[str, str]) -> tuple[float, dict[str, RunFigures]]:
    """Three separate runs: their summed wall seconds and each run's figures."""
    work.mkdir(parents=True, exist_ok=True)
    wall, out = 0.0, {}
    for name, (_, sets) in VARIANTS.items():
        wall += flashdraft(["run-local", "--preset", PRESET, "--set", f"run_id=sep-{name}",
                            *sets_args({**common, **sets})], work)
        out[name] = run_figures(work / "runs", f"sep-{name}")
    return wall, out


def table(sweep: tuple[float, RunFigures, dict[str, RunFigures]], separate: tuple[float, dict[str, RunFigures]]) -> str:
    sweep_wall, base, swept = sweep
    sep_wall, sep = separate
    inference = ("generate", "extract")
    lines = ["| | wall s | generate + extract s | train s (sum) | evaluate s (sum) |", "|---|---:|---:|---:|---:|",
             f"| one sweep | {sweep_wall:.0f} | {base.seconds(*inference):.0f} | "
             f"{sum(f.seconds('train') for f in swept.values()):.0f} | "
             f"{sum(f.seconds('evaluate') for f in swept.values()):.0f} |",
             f"| three runs | {sep_wall:.0f} | {sum(f.seconds(*inference) for f in sep.values()):.0f} | "
             f"{sum(f.seconds('train') for f in sep.values()):.0f} | "
             f"{sum(f.seconds('evaluate') for f in sep.values()):.0f} |",
             "", "| variant | tau (sweep) | tau (separate run) | speedup (sweep / separate) | lossless |",
             "|---|---:|---:|---|---|"]
    for name in VARIANTS:
        a, b = swept[name], sep[name]
        lines.append(f"| {name} | {a.tau:.3f} | {b.tau:.3f} | {a.speedup or 0:.2f}x / {b.speedup or 0:.2f}x | "
                     f"{'yes' if a.lossless and b.lossless else 'NO'} |")
    lines.append(f"\n`{PRESET}`, held-out tau at the full block. Host: {host_line()}.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="FIELD=VALUE for every run of both arms")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    common = {"eval.num_draft_tokens": "7", **dict(s.split("=", 1) for s in args.sets)}
    sweep = sweep_arm(work / "sweep", common)
    separate = separate_arm(work / "separate", common)
    text = table(sweep, separate)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
