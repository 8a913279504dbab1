"""The `make gpu-e2e` / `make gpu-e2e-dry` command: set up, run, measure, check, write the calibration file and
read it back through `flashdraft plan --calibrate`. Exit status 0 only when every check holds; 2 when something the
run needs is missing (one line, before any stage starts)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gpu_e2e import env as envmod
from gpu_e2e.measure import MemorySampler, RunResult, calibration, stage_rows, table
from gpu_e2e.runs import run_local, run_specs

DAG = ("plan", "prep", "generate", "extract", "train", "evaluate", "export", "report")
MODEL_STAGES = ("generate", "extract", "train", "evaluate")  # the stages that run a model on the device
PRODUCTION = "qwen3.6-27b"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


def run_checks(result: RunResult, device: str) -> list[Check]:
    """What a run must show: it succeeded, every DAG stage is done, the model stages ran on `device`, and (the
    rehearsal) the trainer resumed after its preemption, and the lossless check passed."""
    out = [Check(f"{result.name}: run-local succeeded", result.ok, result.error or f"{result.wall_s:.0f} s")]
    stages = result.figures.get("stages", [])
    missing = [s for s in DAG if s not in stages]
    out.append(Check(f"{result.name}: every stage done", not missing, f"missing {missing}" if missing else
                     ", ".join(stages)))
    devices = {r.stage: r.device for r in result.rows}
    wrong = {s: devices.get(s, "-") for s in MODEL_STAGES if not devices.get(s, "").startswith(device)}
    out.append(Check(f"{result.name}: model stages on {device}", not wrong,
                     f"wrong: {wrong}" if wrong else ", ".join(f"{s} {devices[s]}" for s in MODEL_STAGES)))
    out.append(Check(f"{result.name}: lossless", bool(result.figures.get("lossless")), ""))
    if any("preempt_after" in s for s in result.sets):
        resumed = (result.figures.get("train") or {}).get("resumed_from")
        out.append(Check(f"{result.name}: preempted and resumed", bool(resumed), f"resumed_from {resumed}"))
    return out


def plan_reads(cal_file: Path, environ: dict[str, str], work: Path) -> tuple[Check, list[str]]:
    """`flashdraft plan --preset qwen3.6-27b --calibrate FILE --json`, as a user runs it: all three rates must
    say measured."""
    cmd = [sys.executable, "-m", "flashdraft.cli.main", "plan", "--preset", PRODUCTION, "--calibrate", str(cal_file),
           "--json"]
    proc = subprocess.run(cmd, cwd=work, env=environ, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return Check("plan --calibrate reads the file", False, (proc.stderr or proc.stdout).strip()[-300:]), []
    hours = json.loads(proc.stdout)["gpu_hours"]
    lines = [f"{stage}: {v['tokens_per_s_per_gpu']} tokens/s/GPU on {v['gpu']}, {v['rate_source']}"
             for stage, v in hours.items()]
    assumed = [stage for stage, v in hours.items() if not v["rate_source"].startswith("measured")]
    return Check("plan --calibrate: generate, extract, train measured", not assumed,
                 f"not measured: {assumed}" if assumed else ""), lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry", action="store_true", help="on CPU at tiny shapes (CI; make gpu-e2e-dry)")
    parser.add_argument("--work", default=None, help="scratch folder (stores, kfp.local root; default: a temp dir)")
    parser.add_argument("--out", default=None, help="where the table, results JSON, calibration file and run logs "
                                                   "go (default: WORK/out)")
    parser.add_argument("--only", action="append", choices=("tiny", "rehearsal"), default=None,
                        help="run only this one (repeatable)")
    parser.add_argument("--commit", default=os.environ.get("FLASHDRAFT_COMMIT"), help="git commit, for the file")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="wall seconds for the whole script (default 540 on a GPU, none with --dry): a run gets "
                             "what is left, so the table of what finished still comes back inside the device "
                             "tool's 600 s")
    args = parser.parse_args(argv)
    budget = args.budget_s if args.budget_s is not None else (None if args.dry else 540.0)
    t0 = time.monotonic()
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-e2e-")).resolve()
    out = Path(args.out).resolve() if args.out else work / "out"
    out.mkdir(parents=True, exist_ok=True)
    try:
        env = envmod.prepare(args.dry, work)
    except envmod.Missing as exc:
        return int(exc.code)
    from flashdraft.config import load_config
    from flashdraft.run.provenance import git_commit

    commit = args.commit or git_commit()
    print(f"gpu-e2e: {env.gpu['device']}; work {work}; setup {time.monotonic() - t0:.0f} s", flush=True)
    results, checks = [], []
    for spec in run_specs(args.dry, work, tuple(args.only or ())):
        if budget is not None:  # what is left, less ~30 s for reading the records, the plan and the table
            left = int(budget - (time.monotonic() - t0) - 30)
            if left < 60:
                checks.append(Check(f"{spec.name}: run-local succeeded", False, f"not started: {left + 30} s left"))
                continue
            spec = replace(spec, timeout_s=min(spec.timeout_s, left))
        with MemorySampler(env.device) as sampler:
            rc, wall, error = run_local(spec, work, env.environ, out)
        result = RunResult(spec.name, spec.preset, spec.sets, rc, wall, error=error)
        cfg = load_config(preset=spec.preset, overrides=list(spec.sets))
        try:
            result.rows, result.figures = stage_rows(spec.name, cfg, sampler, env.gpu["name"], env.gpu["peak_tflops"])
        except Exception as exc:  # noqa: BLE001 - a run that left no records is reported, not a traceback
            result.error = result.error or f"reading its records: {type(exc).__name__}: {exc}"
        results.append(result)
        checks += run_checks(result, env.device)
        if spec.production_width and not (result.ok and result.figures.get("train")):
            checks.append(Check("calibration file written", False, f"the {spec.name} run did not finish training"))
        elif spec.production_width:
            note = ("dry run on CPU at tiny shapes: the 'GPU' peak and bandwidth are this CPU's measured fp32 matmul "
                    "and copy rates, stand-ins that exercise the file and the planner's arithmetic; calibrates "
                    "nothing" if args.dry else
                    "make gpu-e2e: the rehearsal's rates (5 random full-width Qwen3.6-27B layers, 3 short prompts); "
                    "its rows are a few hundred tokens, so the train rate and MFU are far below a full row's")
            cal = calibration(result, cfg, env.gpu, env.device, commit, note)
            from flashdraft.perf.calibration import save_calibration

            cal_file = save_calibration(cal, out / "calibration.json")
            check, lines = plan_reads(cal_file, env.environ, work)
            checks.append(check)
            print("plan --calibrate " + str(cal_file) + ":\n  " + "\n  ".join(lines), flush=True)
        write_report(out, env, args.dry, commit, t0, results, checks, final=False)  # kept if the next run dies
    return write_report(out, env, args.dry, commit, t0, results, checks, final=True)


def write_report(out: Path, env, dry: bool, commit: str | None, t0: float, results: list[RunResult],
                 checks: list[Check], final: bool) -> int:
    """gpu-e2e.txt (the table, the checks, the verdict) and gpu-e2e.json under `out`; printed when final."""
    rows = [r for res in results for r in res.rows]
    text = table(rows)
    verdict = all(c.ok for c in checks) and bool(checks)
    check_lines = [f"{'ok  ' if c.ok else 'FAIL'}  {c.name}{f'  ({c.detail})' if c.detail else ''}" for c in checks]
    state = ("PASS" if verdict else "FAIL") if final else "RUNNING"
    report = (f"{text}\n\n" + "\n".join(check_lines) +
              f"\n\ngpu-e2e {state} in {time.monotonic() - t0:.0f} s on {env.gpu['device']}")
    if final:
        print(report, flush=True)
    (out / "gpu-e2e.txt").write_text(report + "\n")
    (out / "gpu-e2e.json").write_text(json.dumps({
        "device": env.gpu, "dry": dry, "commit": commit, "wall_s": round(time.monotonic() - t0, 1), "final": final,
        "pass": verdict, "checks": [asdict(c) for c in checks],
        "runs": [{"name": r.name, "preset": r.preset, "sets": list(r.sets), "rc": r.rc, "wall_s": r.wall_s,
                  "error": r.error} for r in results],
        "stages": [asdict(r) for r in rows]}, indent=2, default=str) + "\n")
    return 0 if verdict else 1
