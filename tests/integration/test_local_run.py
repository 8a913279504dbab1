"""The whole pipeline under kfp.local (`flashdraft run-local`), and the plan gate stopping it before any GPU stage."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.shared_runs import CONSOLE_MAX_BYTES, CONSOLE_MAX_LINES
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.config import load_config
from flashdraft.pipelines.local import run_local
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


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


def test_plan_gate_stops_a_run_over_its_max_cost_naming_a_cheaper_row(tmp_path):
    """Issue 41: the tiny run planned on GPU pools for a billion samples (plan-only figures: the gate stops it before
    anything reads them), with plan.max_cost_usd between the cheapest row's cost and the configured one's."""
    from flashdraft.components.plan.planner import comparison_of, make_plan

    cfg = load_config(preset="tiny", overrides={
        "storage.root": f"file://{tmp_path}/store", "pools.trainer.gpu_type": "b200",
        "pools.inference.gpu_type": "rtx-pro-6000", "data.expected_samples": 10**9})
    cmp = comparison_of(make_plan(cfg))
    configured, cheapest = cmp.row(cmp.configured), cmp.rows[0]
    assert cheapest.total_cost_usd < configured.total_cost_usd
    limit = (cheapest.total_cost_usd + configured.total_cost_usd) / 2
    result = run_local(cfg.with_overrides({"plan.max_cost_usd": limit}), str(tmp_path / "kfp"))
    assert result["state"] == "FAILED"
    assert result["failure"].stage == "plan" and result["failure"].error_type == "PlanGateError"
    assert "plan.max_cost_usd" in result["failure"].error and cheapest.key in result["failure"].error
    store = open_store(cfg.storage, cfg.run_id)
    assert not store.list(f"{layout.PROMPTS}/"), "nothing ran after the gate"

@pytest.mark.integration
def test_a_failed_stage_is_named_last_on_the_console_and_in_the_report(tmp_path):
    """A target path that does not exist: plan (the gate, which pins the target before any GPU task) fails naming
    target.model. The console ends with the stage, the exception and its log file; the report says plan failed with
    that error and every later stage not run; the console stays short and holds no kfp executor dump."""
    missing = tmp_path / "no-such-target"
    args = ["run-local", "--preset", "tiny", "--workdir", str(tmp_path / "kfp"), "--set",
            f"storage.root=file://{tmp_path}/store", "--set", "target.source=hf", "--set", f"target.model={missing}",
            # planning hints for the new model (the preset's describe tiny-qwen3 and are dropped with it)
            "--set", "target.num_layers=8", "--set", "target.hidden_size=256"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 1, out.output[-3000:]
    lines = out.output.splitlines()
    assert lines[-2] == (f"FAILED: plan: TargetNotFoundError: target.model={missing}: no such folder; set "
                         "target.model to a local model folder or a Hub id (namespace/name)"), lines[-4:]
    log_file = Path(lines[-1].removeprefix("log: "))
    assert log_file.name == "plan.log" and "Traceback" in log_file.read_text()
    assert CONSOLE_MAX_LINES >= len(lines) and CONSOLE_MAX_BYTES >= len(out.output.encode())
    assert "executor_input" not in out.output and "KFP Executor" not in out.output
    assert "executor_input" in (log_file.parent / "kfp-local.log").read_text(), "the dump went to the log file"
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store"})
    summary = open_store(cfg.storage, cfg.run_id).get(f"{layout.REPORTS}/summary.md").decode()
    assert f"| plan | failed: TargetNotFoundError: target.model={missing}" in summary  # names the setting
    assert f"log: {log_file})" in summary
    for stage in ("prep", "generate", "extract", "train", "evaluate", "export"):
        assert f"| {stage} | not run |" in summary, stage


def test_a_changed_setting_no_stage_can_carry_on_from_stops_run_local_before_any_task(tmp_path):
    """After a run, `run-local` with a changed data.max_samples ends in one line naming the field and the choices,
    exit 1, before kfp starts a task (prep's committed result is the stand-in's, untouched)."""
    from flashdraft.run.runner import run_task
    from flashdraft.run.status import read_record

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
