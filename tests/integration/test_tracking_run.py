"""A whole tiny run logging to TensorBoard and a real MLflow server (tracking.report_to), with its train stage
preempted and resumed (training.preempt_after: the first launch stops after a checkpoint, the second resumes):
one unbroken loss series in both, evaluate's tau, the config as parameters, the report and model card as artifacts.
It trains the field's recipe (D-PACE weights, Muon), so the recipe's preempted run is evaluated lossless end to end
(its resume to the same bytes: tests/integration/test_train.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashdraft.config import load_config
from flashdraft.storage import layout
from flashdraft.storage.store import open_store

pytestmark = pytest.mark.slow


def _series(logdir: Path, run: str, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer().AddRunsFromDirectory(str(logdir))
    mux.Reload()
    return [(e.step, e.value) for e in mux.Scalars(run, tag)]


def test_tiny_run_logs_to_tensorboard_and_mlflow_through_a_preemption(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    run_id = f"tracked-{tmp_path.name[-8:]}"
    sets = {"run_id": run_id, "storage.root": f"file://{tmp_path}/runs", "tracking.report_to": "[tensorboard, mlflow]",
            "training.checkpoint_every": "2", "training.preempt_after": "2", "training.heldout_samples": "2",
            "training.heldout_every": "2", "drafter.loss_weights": "dpace", "training.optimizer": "muon"}
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": "flashdraft-run-tests"}
    command = [str(Path(sys.executable).parent / "flashdraft"), "run-local", "--preset", "tiny",
               "--workdir", str(tmp_path / "kfp"), *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tracking:" not in out.stdout + out.stderr, "no tracker warned"

    cfg = load_config(preset="tiny", overrides=[f"{k}={v}" for k, v in sets.items()])
    store = open_store(cfg.storage, cfg.run_id)
    train = store.get_json_verified(layout.metrics_key("train"))
    steps = train["steps"]
    assert train["resumed_from"] == 2 and steps > 2, "the second launch resumed from the first one's checkpoint"
    logdir = tmp_path / "runs" / run_id / layout.TENSORBOARD
    loss = _series(logdir, "train", "train/loss")
    assert [s for s, _ in loss] == list(range(1, steps + 1)), "one point per optimizer step, across the preemption"
    assert [v for _, v in loss] == pytest.approx([h["loss"] for h in train["history"]], rel=1e-5)
    assert [s for s, _ in _series(logdir, "train", "train/heldout/tau")] == [h["step"] for h in train["heldout"]]
    evaluated = store.get_json_verified(layout.metrics_key("evaluate"))
    assert evaluated["lossless"]["checked"] and evaluated["lossless"]["passed"], evaluated["lossless"]
    assert _series(logdir, "evaluate", "evaluate/drafter/tau")[-1][1] == pytest.approx(evaluated["drafter"]["tau"])

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("flashdraft-run-tests")
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`flashdraft.run_id` = '{run_id}'")
    assert len(runs) == 1 and runs[0].info.run_name == run_id
    mlrun = runs[0]
    assert mlrun.data.params["training.lr"] == str(cfg.training.lr)
    assert (mlrun.data.params["training.optimizer"], mlrun.data.params["drafter.loss_weights"]) == ("muon", "dpace")
    history = sorted((m.step, m.value) for m in client.get_metric_history(mlrun.info.run_id, "train/loss"))
    assert [s for s, _ in history] == list(range(1, steps + 1))
    assert mlrun.data.metrics["evaluate/drafter/tau"] == pytest.approx(evaluated["drafter"]["tau"])
    assert mlrun.data.metrics["evaluate/suites/heldout/tau"] == pytest.approx(evaluated["suites"][0]["tau"])
    artifacts = {a.path for folder in ("report", "model-card/zlab")
                 for a in client.list_artifacts(mlrun.info.run_id, folder)}
    assert {"report/report.html", "model-card/zlab/README.md"} <= artifacts, artifacts
