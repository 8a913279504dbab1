"""`make gpu-e2e`'s parts that need no run (benchmarks/gpu_e2e): it fails fast in one line without a GPU, and its
checks fail a run that did not show what the GPU run must show. The whole script on CPU (`make gpu-e2e-dry`) is
tests/integration/test_gpu_e2e_dry.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_e2e.cli import run_checks  # noqa: E402
from gpu_e2e.measure import RunResult, StageRow  # noqa: E402
from gpu_e2e.runs import REHEARSAL_RECIPE, run_specs  # noqa: E402


def test_without_a_gpu_it_stops_in_one_line_before_any_stage(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_e2e"), "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]  # one line
    assert proc.stderr.startswith("gpu-e2e: no CUDA device") and "make gpu-e2e-dry" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_and_gpu_rehearsals_share_the_recipe_and_the_gpu_one_is_full_width(tmp_path):
    gpu, dry = run_specs(False, tmp_path), run_specs(True, tmp_path)
    assert [s.name for s in gpu] == [s.name for s in dry] == ["rehearsal", "tiny"]  # calibration first
    assert gpu[0].preset == "qwen3.6-27b-rehearsal" and dry[0].preset == "tiny-qwen35"
    for spec in (gpu[0], dry[0]):
        assert set(REHEARSAL_RECIPE) <= set(spec.sets) and spec.production_width
    assert "training.feature_decode=device" in gpu[1].sets and "training.feature_decode=device" in dry[1].sets
    assert "drafter.kind=dflash2" in gpu[0].sets  # the production drafter, at full width
    assert [s.name for s in run_specs(False, tmp_path, ("tiny",))] == ["tiny"]


def _result(**figures) -> RunResult:
    rows = [StageRow("r", s, "cuda" if s in ("generate", "extract", "train", "evaluate") else "-", 1.0)
            for s in ("plan", "prep", "generate", "extract", "train", "evaluate", "export", "report")]
    return RunResult("r", "p", ("training.preempt_after=1",), 0, 10.0, rows,
                     {"stages": [r.stage for r in rows], "lossless": True, "train": {"resumed_from": 1}, **figures})


def test_checks_pass_a_complete_run_and_name_what_a_broken_one_lacks():
    assert all(c.ok for c in run_checks(_result(), "cuda"))
    broken = _result(train={"resumed_from": None}, lossless=False)
    broken.rows[2].device = "cpu"  # generate fell back to the CPU
    broken.figures["stages"].remove("export")
    failed = {c.name: c.detail for c in run_checks(broken, "cuda") if not c.ok}
    assert set(failed) == {"r: every stage done", "r: model stages on cuda", "r: lossless",
                           "r: preempted and resumed"}
    assert "export" in failed["r: every stage done"] and "generate" in failed["r: model stages on cuda"]
