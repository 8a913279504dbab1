"""`make gpu-e2e-dry`: the GPU end-to-end script itself (benchmarks/gpu_e2e) on CPU at tiny shapes, so the GPU call
is never the first time it runs: both runs through `flashdraft run-local` (kfp.local), every stage done on the
expected device, the rehearsal's DFlash2 trainer through torchrun (one gloo rank, FSDP2) preempted and resumed,
lossless, exported, reported; the table; a calibration file that `flashdraft plan --calibrate` reads as measured
for generate, extract and train. 113 s on a quiet 2-core machine (2026-12-06)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flashdraft.components.plan.planner import make_plan
from flashdraft.config import load_config
from flashdraft.perf.calibration import load_calibration

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


def test_gpu_e2e_dry_runs_the_whole_script_on_cpu(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_e2e"), "--dry", "--work",
                           str(tmp_path / "work"), "--out", str(out)], capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    result = json.loads((out / "gpu-e2e.json").read_text())
    assert result["pass"] and result["dry"]
    checks = {c["name"]: c for c in result["checks"]}
    for name in ("tiny: every stage done", "rehearsal: every stage done", "tiny: model stages on cpu",
                 "rehearsal: preempted and resumed", "rehearsal: lossless",
                 "plan --calibrate: generate, extract, train measured"):
        assert checks[name]["ok"], name
    stages = {(s["run"], s["stage"]): s for s in result["stages"]}
    train = stages[("rehearsal", "train")]
    assert train["device"] == "cpu" and train["tokens_per_s"] > 0 and train["peak_bytes"] > 0
    assert train["predicted_bytes"] > 0 and train["note"] == "resumed from step 1"
    assert stages[("tiny", "generate")]["tokens_per_s"] > 0 and stages[("tiny", "extract")]["tokens_per_s"] > 0
    table = (out / "gpu-e2e.txt").read_text()
    assert "plan peak GiB/GPU" in table and table.rstrip().splitlines()[-1].startswith("gpu-e2e PASS")
    # the calibration file, read by the planner (not only by the script's own check)
    cal = load_calibration(out / "calibration.json")
    assert cal.rates.generate.bytes_per_token and cal.rates.extract.flops_per_token and cal.rates.train.flops_per_token
    assert cal.rates.train.shape.world_size == 1 and cal.rates.train.note.startswith("the train stage through torchrun")
    plan = make_plan(load_config(preset="qwen3.6-27b", overrides={"plan.calibration": str(out / "calibration.json")}))
    assert all(v.rate_source.startswith("measured") for v in plan.gpu_hours.values())
    # the stage records say which device each model stage used, and the console line shows it
    log = (out / "run-local-rehearsal.log").read_text()
    for stage in ("generate shard 0", "extract shard 0", "train", "evaluate"):
        assert re.search(rf"{stage}\s+done .*\(on cpu\)$", log, re.M), stage
