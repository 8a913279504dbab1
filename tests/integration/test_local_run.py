"""The whole pipeline under kfp.local (`flashdraft run-local`), and the plan gate stopping it before any GPU stage."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.shared_runs import CONSOLE_MAX_BYTES, CONSOLE_MAX_LINES
from typer.testing import CliRunner

from flashdraft import layout
from flashdraft.cli import app
from flashdraft.config import load_config
from flashdraft.pipelines.local import run_local
from flashdraft.store import open_store


def test_plan_gate_stops_an_over_budget_offline_run_before_gpu_stages(tmp_path):
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store", "storage.budget_bytes": 1})
    result = run_local(cfg, str(tmp_path / "kfp"))
    assert result["state"] == "FAILED"
    store = open_store(cfg.storage, cfg.run_id)
    assert store.is_committed(layout.metrics_key("plan")), "the gate ran and recorded its plan"
    assert not store.list(f"{layout.PROMPTS}/") and not store.list(f"{layout.RESPONSES}/"), "nothing ran after it"
    assert result["report"] and Path(result["report"]).is_file(), "the exit handler still wrote the report"
    assert result["failure"].stage == "plan" and result["failure"].error_type == "PlanGateError"
    summary = store.get(f"{layout.REPORTS}/summary.md").decode()
    assert "plan" in summary


@pytest.mark.integration
def test_a_failed_stage_is_named_last_on_the_console_and_in_the_report(tmp_path):
    """A target path that does not exist: prep (the first stage that loads the tokenizer) fails naming
    target.model. The console ends with the stage, the exception and its log file; the report says prep failed with
    that error and every later stage not run; the console stays short and holds no kfp executor dump."""
    missing = tmp_path / "no-such-target"
    args = ["run-local", "--preset", "tiny", "--workdir", str(tmp_path / "kfp"), "--set",
            f"storage.root=file://{tmp_path}/store", "--set", "target.source=hf", "--set", f"target.model={missing}",
            # planning hints for the new model (the preset's describe tiny-qwen3 and are dropped with it)
            "--set", "target.num_layers=8", "--set", "target.hidden_size=256"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 1, out.output[-3000:]
    lines = out.output.splitlines()
    assert lines[-2].startswith(f"FAILED: prep: TargetNotFoundError: target.model={missing}"), lines[-4:]
    log_file = Path(lines[-1].removeprefix("log: "))
    assert log_file.name == "prep.log" and "Traceback" in log_file.read_text()
    assert CONSOLE_MAX_LINES >= len(lines) and CONSOLE_MAX_BYTES >= len(out.output.encode())
    assert "executor_input" not in out.output and "KFP Executor" not in out.output
    assert "executor_input" in (log_file.parent / "kfp-local.log").read_text(), "the dump went to the log file"
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store"})
    summary = open_store(cfg.storage, cfg.run_id).get(f"{layout.REPORTS}/summary.md").decode()
    assert f"| prep | failed: TargetNotFoundError: target.model={missing}" in summary  # names the setting
    assert f"log: {log_file})" in summary
    assert "| plan | done |" in summary
    for stage in ("generate", "extract", "train", "evaluate", "export"):
        assert f"| {stage} | not run |" in summary, stage


def test_a_changed_setting_no_stage_can_carry_on_from_stops_run_local_before_any_task(tmp_path):
    """After a run, `run-local` with a changed data.max_samples ends in one line naming the field and the choices,
    exit 1, before kfp starts a task (prep's committed result is the stand-in's, untouched)."""
    from flashdraft.runner import run_task
    from flashdraft.status import read_record

    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store"})
    run_task(cfg, "prep", body=lambda: {"kept": 30, "num_train": 26, "num_eval": 4, "quarantined": 0})
    store = open_store(cfg.storage, cfg.run_id)
    before = read_record(store, "prep")
    args = ["run-local", "--preset", "tiny", "--workdir", str(tmp_path / "kfp"), "--set",
            f"storage.root=file://{tmp_path}/store", "--set", "data.max_samples=30"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 1
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("prep: changed since its committed result: data.max_samples "
                                                   "40 -> 30;") and "--from prep" in lines[0], out.output
    assert not (tmp_path / "kfp").exists(), "nothing ran"
    assert read_record(store, "prep") == before
