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


def test_stage_records_and_their_console_line_name_the_device(tmp_path):
    """What `make gpu-e2e` checks per stage: the runner copies a summary's `device` into the task's record and its
    line; a stage that reports none (prep) has neither."""
    from flashdraft.cli.console import record_line
    from flashdraft.config import load_config
    from flashdraft.run.runner import run_task
    from flashdraft.run.status import read_records
    from flashdraft.storage.store import open_store

    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs"})
    run_task(cfg, "generate", body=lambda: {"samples": 2, "generated_tokens": 40, "generation_seconds": 2.0,
                                            "device": "cuda"}, shard=0)
    run_task(cfg, "prep", body=lambda: {"kept": 3, "num_train": 2, "num_eval": 1})
    records = {r.stage: r for r in read_records(open_store(cfg.storage, cfg.run_id))}
    gen, prep = records["generate"], records["prep"]
    assert gen.device == "cuda" and gen.headline.endswith("(on cuda)") and record_line(gen).endswith("(on cuda)")
    assert prep.device is None and "(on " not in prep.headline
