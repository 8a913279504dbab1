"""`flashdraft plan --compare` speed (issue 41: the table in under 5 s on a 2-core machine).

Runs the command as a user would (a fresh process each time: interpreter start, imports, the plan and every
topology priced, the table printed) `--rounds` times and prints the median and the slowest wall time beside the
5 s target, and the in-process time of `make_plan` alone (the pipeline's plan stage pays only that).

Run: `.venv/bin/python benchmarks/bench_plan.py [--rounds 5]`
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 5.0
COMMAND = ["plan", "--preset", "qwen3.6-27b", "--compare"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    flashdraft = Path(sys.executable).with_name("flashdraft")
    walls = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        out = subprocess.run([str(flashdraft), *COMMAND], capture_output=True, text=True, check=True).stdout
        walls.append(time.perf_counter() - t0)
        assert "Topologies by total cost" in out, out[-2000:]
    from flashdraft.components.plan.planner import make_plan
    from flashdraft.config import load_config

    cfg = load_config(preset="qwen3.6-27b")
    make_plan(cfg)  # warm: imports and the first target resolution
    t0 = time.perf_counter()
    plan = make_plan(cfg)
    in_process = time.perf_counter() - t0
    print(f"flashdraft {' '.join(COMMAND)}: median {statistics.median(walls):.2f} s, slowest {max(walls):.2f} s "
          f"over {args.rounds} fresh processes (target < {TARGET_S:.0f} s: "
          f"{'met' if max(walls) < TARGET_S else 'MISSED'})")
    print(f"make_plan in process: {in_process:.3f} s for {len(plan.comparison.rows)} rows")


if __name__ == "__main__":
    main()
