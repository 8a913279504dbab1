"""What the SmolLM2 benchmarks that compare whole runs share: a documented command run as the user runs it (a
subprocess, timed), and the figures one finished run committed (stage seconds from its task records, evaluate's
taus and speedup from its metrics).

Used by bench_responses.py (issue 49's table) and bench_sweep.py (issue 50's table).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.config import StorageConfig
from flashdraft.run import status
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore, open_store


def flashdraft(args: list[str], cwd: Path) -> float:
    """Run `flashdraft ARGS` in `cwd` (its console to ours) and return its wall seconds; a failure stops the
    benchmark, naming the command."""
    exe = Path(sys.executable).with_name("flashdraft")
    print(f"$ flashdraft {shlex.join(args)}", flush=True)
    t0 = time.monotonic()
    done = subprocess.run([str(exe), *args], cwd=cwd, check=False)
    seconds = round(time.monotonic() - t0, 1)
    if done.returncode:
        raise SystemExit(f"flashdraft {shlex.join(args)} failed (exit {done.returncode})")
    return seconds


@dataclass(frozen=True)
class RunFigures:
    """One finished run's figures, from its committed records."""

    run_id: str
    stage_s: dict[str, float]        # per stage, the sum of its tasks' durations (shards summed); reused: 0
    tau: float | None                # the first suite's, at the decoded draft length (None: not evaluated)
    tau_full_block: float | None
    num_drafts: int | None
    speedup: float | None
    lossless: bool | None

    def seconds(self, *stages: str) -> float:
        return round(sum(self.stage_s.get(s, 0.0) for s in stages), 1)


def run_store(runs_root: Path, run_id: str) -> ObjectStore:
    """Run `run_id`'s store under the local runs/ folder `runs_root`, read only."""
    return open_store(StorageConfig(root=f"file://{runs_root.resolve()}"), run_id, read_only=True)


def run_figures(runs_root: Path, run_id: str, *, evaluated: bool = True) -> RunFigures:
    """The figures of run `run_id` under the local store `runs_root` (the runs/ folder a run-local writes);
    `evaluated=False` for a run without an evaluate task (a sweep's base run): its stage seconds only."""
    store = run_store(runs_root, run_id)
    stage_s: dict[str, float] = {}
    for record in status.read_records(store):
        if record.state == "done" and record.duration_s is not None and not record.reused:
            stage_s[record.stage] = round(stage_s.get(record.stage, 0.0) + record.duration_s, 1)
    if not evaluated:
        return RunFigures(run_id, stage_s, None, None, None, None, None)
    ev = EvaluateSummary.model_validate(store.get_json_verified(layout.metrics_key("evaluate")))
    suite = ev.suites[0]
    dl = ev.draft_length
    return RunFigures(run_id, stage_s, round(suite.tau, 3), dl.full_block_tau if dl else None,
                      dl.num_drafts if dl else None, suite.speedup,
                      all(s.lossless_passed for s in ev.suites if s.lossless_passed is not None))


def stage_figures(runs_root: Path, run_id: str, stage: str) -> dict[str, float]:
    """The figures of a run's (unsharded) stage task, as its status record holds them."""
    store = run_store(runs_root, run_id)
    record = status.read_record(store, stage)
    if record is None:
        raise SystemExit(f"run {run_id}: no {stage} record under {runs_root}")
    return record.figures


def host_line() -> str:
    """The machine the figures came from: CPU model, AVX-512 or not, cores, load at the end."""
    model, flags = "unknown CPU", ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    avx = "AVX-512" if " avx512f" in flags else ("AVX2, no AVX-512" if " avx2" in flags else "no AVX2")
    return f"{model} ({avx}), {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end"
