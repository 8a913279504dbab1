"""The whole pipeline under kfp.local (`flashdraft run-local`), and the plan gate stopping it before any GPU stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flashdraft.pipelines.local import run_local
from typer.testing import CliRunner

from flashdraft import layout
from flashdraft.cli import app
from flashdraft.config import load_config
from flashdraft.store import open_store

# Small enough for a smoke run on 2 cores; every stage still runs for real on the tiny target.
SMOKE = {"data.max_samples": 16, "data.eval_count": 2, "data.max_response_tokens": 16, "eval.num_prompts": 2,
         "eval.max_new_tokens": 16, "training.epochs": 1}


def test_plan_gate_stops_an_over_budget_offline_run_before_gpu_stages(tmp_path):
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store", "storage.budget_bytes": 1})
    result = run_local(cfg, str(tmp_path / "kfp"))
    assert result["state"] == "FAILED"
    store = open_store(cfg.storage, cfg.run_id)
    assert store.is_committed(layout.metrics_key("plan")), "the gate ran and recorded its plan"
    assert not store.list(f"{layout.PROMPTS}/") and not store.list(f"{layout.RESPONSES}/"), "nothing ran after it"
    assert result["report"] and Path(result["report"]).is_file(), "the exit handler still wrote the report"
    summary = store.get(f"{layout.REPORTS}/summary.md").decode()
    assert "plan" in summary


@pytest.mark.slow
def test_run_local_tiny_smoke_prints_report_tau_and_bytes(tmp_path):
    sets = [f"storage.root=file://{tmp_path}/store", *(f"{k}={v}" for k, v in SMOKE.items())]
    args = ["run-local", "--preset", "tiny", "--workdir", str(tmp_path / "kfp")]
    for s in sets:
        args += ["--set", s]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output[-3000:]
    printed = dict(line.split(": ", 1) for line in out.output.splitlines() if line.split(": ", 1)[0] in
                   ("report", "tau", "planned_bytes", "stored_bytes"))
    assert Path(printed["report"]).is_file()
    assert float(printed["tau"]) >= 1.0, "tau counts the verified token, so it is at least 1"
    assert int(printed["planned_bytes"]) > 0 and int(printed["stored_bytes"]) > 0
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store"})
    store = open_store(cfg.storage, cfg.run_id)
    for stage in ("plan", "prep", "evaluate"):
        assert store.is_committed(layout.metrics_key(stage)), stage
    scalars = json.loads(store.get(f"{layout.REPORTS}/metrics.json"))
    assert scalars.get("tau") == pytest.approx(float(printed["tau"]))
