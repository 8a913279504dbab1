"""The trackers against their real counterparts: a real MLflow server read back with MLflow's client, W&B in its
offline mode read back from its files, TensorBoard event files in a real S3 store read back by TensorBoard."""

from __future__ import annotations

import time

import pytest
from support.wandb_records import config, finished, history

from flashdraft.config import load_config
from flashdraft.storage import layout
from flashdraft.storage.store import open_store
from flashdraft.tracking import open_tracker


@pytest.fixture()
def cfg(tmp_path):
    return load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs",
                                                 "run_id": f"track-{tmp_path.name[-12:]}"})


def test_mlflow_one_run_per_flashdraft_run_reopened_by_every_task(cfg, mlflow_server, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "flashdraft-tests")
    cfg = cfg.with_overrides({"tracking.report_to": ["mlflow"]})
    store = open_store(cfg.storage, cfg.run_id)
    with open_tracker(cfg, "train", store) as train:
        assert train.names == ["mlflow"]
        for step in (1, 2, 3):
            train.log("train", {"loss": 4.0 - step, "acc_by_pos": [0.1 * step]}, step)
    with open_tracker(cfg, "train", store) as resumed:  # a restarted pod replays step 3, then goes on
        resumed.log("train", {"loss": 9.0}, 3)
        resumed.log("train", {"loss": 0.5}, 4)
    with open_tracker(cfg, "evaluate", store) as evaluate:
        evaluate.log("evaluate", {"heldout": {"tau": 2.25, "speedup": 1.4}}, 0)
        evaluate.artifact("model-card/README.md", b"# drafter\n")

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("flashdraft-tests")
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`flashdraft.run_id` = '{cfg.run_id}'")
    assert len(runs) == 1, "every task reopens the flashdraft run's one MLflow run"
    run = runs[0]
    assert run.info.run_name == cfg.run_id and run.info.status == "FINISHED"
    assert run.data.params["training.lr"] == str(cfg.training.lr)
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 3.0), (2, 2.0), (3, 1.0), (4, 0.5)]
    assert run.data.metrics["evaluate/heldout/tau"] == 2.25
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "model-card")]
    assert artifacts == ["model-card/README.md"]


def _rows_when_written(path, key: str, timeout_s: float = 60) -> list[dict]:
    """W&B's core process writes the offline file after `finish()` returns: wait for its exit record, then read."""
    deadline = time.monotonic() + timeout_s
    while not finished(path) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [r for r in history(path) if key in r]


def test_wandb_offline_run_holds_config_and_series(cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb-dir").mkdir()
    cfg = cfg.with_overrides({"tracking.report_to": ["wandb"]})
    store = open_store(cfg.storage, cfg.run_id)
    with open_tracker(cfg, "train", store) as tracker:
        assert tracker.names == ["wandb"]
        for step in (1, 2):
            tracker.log("train", {"loss": 3.0 / step}, step)
    files = list((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, "one offline run, the file `wandb sync` uploads"
    rows = _rows_when_written(files[0], "train/loss")
    assert [(r["train/step"], r["train/loss"]) for r in rows] == [(1, 3.0), (2, 1.5)]
    assert config(files[0])["training.lr"] == str(cfg.training.lr)


def test_tensorboard_event_files_in_a_real_s3_store(tiny_cfg, s3_storage, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_cfg.model_copy(update={"storage": s3_storage})
    store = open_store(cfg.storage, cfg.run_id)
    with open_tracker(cfg, "train", store) as tracker:
        for step in (1, 2, 3):
            tracker.log("train", {"loss": 1.0 / step}, step)
    keys = [k for k in store.list(layout.tensorboard_prefix("train")) if "tfevents" in k]
    assert keys, "event files under <run>/tensorboard/train/ in the bucket"
    local = tmp_path / "tb"
    local.mkdir()
    for key in keys:
        (local / key.rsplit("/", 1)[-1]).write_bytes(store.get(key))
    acc = EventAccumulator(str(local))
    acc.Reload()
    assert [(e.step, round(e.value, 4)) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 0.5), (3, 0.3333)]
