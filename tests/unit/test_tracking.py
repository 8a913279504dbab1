"""The tracker every stage logs through: flat tags, TensorBoard event files in the run's store read back by
TensorBoard's own reader, one unbroken series across a resumed task, and a failing tracker that costs one warning."""

from __future__ import annotations

import logging
import socket

import pytest

from flashdraft.config import ConfigError, load_config
from flashdraft.storage import layout
from flashdraft.storage.store import open_store
from flashdraft.tracking import flat_numbers, flat_params, open_tracker


def tensorboard_series(store, task: str, tag: str) -> list[tuple[int, float]]:
    """(step, value) of one tag as TensorBoard reads the run's tensorboard/ folder."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    logdir = store.url(layout.TENSORBOARD).removeprefix("file://")
    mux = EventMultiplexer().AddRunsFromDirectory(logdir)
    mux.Reload()
    return [(e.step, round(e.value, 6)) for e in mux.Scalars(task, tag)]


@pytest.fixture()
def cfg(tmp_path):
    return load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs"})


def test_flat_numbers_joins_nested_and_indexes_lists_from_one():
    values = {"loss": 1.5, "acc_by_pos": [0.5, 0.25], "drafter": {"tau": 2.0, "ok": True}, "note": "x", "n": None}
    assert flat_numbers(values, "train/") == {"train/loss": 1.5, "train/acc_by_pos/1": 0.5,
                                              "train/acc_by_pos/2": 0.25, "train/drafter/tau": 2.0}


def test_flat_numbers_names_list_items_by_their_name():
    """Evaluate's suites are tagged by suite, not by position: `suites/humaneval/tau`."""
    values = {"suites": [{"name": "heldout", "tau": 2.1}, {"name": "humaneval", "tau": 1.4, "speedup": 1.1}]}
    assert flat_numbers(values) == {"suites/heldout/tau": 2.1, "suites/humaneval/tau": 1.4,
                                    "suites/humaneval/speedup": 1.1}


def test_flat_params_are_dotted_strings(cfg):
    params = flat_params(cfg)
    assert params["training.lr"] == str(cfg.training.lr)
    assert params["run_id"] == cfg.run_id
    assert all(isinstance(v, str) for v in params.values())


def test_tensorboard_series_in_the_store_read_by_tensorboard(cfg):
    store = open_store(cfg.storage, cfg.run_id)
    with open_tracker(cfg, "train", store) as tracker:
        assert tracker.names == ["tensorboard"]
        for step in range(1, 4):
            tracker.log("train", {"loss": 1.0 / step, "acc_by_pos": [0.5, 0.1 * step]}, step)
    assert tensorboard_series(store, "train", "train/loss") == [(1, 1.0), (2, 0.5), (3, round(1 / 3, 6))]
    assert tensorboard_series(store, "train", "train/acc_by_pos/2")[-1] == (3, pytest.approx(0.3, abs=1e-6))


def test_a_resumed_task_continues_the_series_without_repeating_steps(cfg):
    """A trainer killed after logging step 5 resumes from its step-2 checkpoint and replays steps 3-5: the series
    keeps one point per step, and a second prefix (the held-out curve) keeps its own high-water mark."""
    store = open_store(cfg.storage, cfg.run_id)
    with open_tracker(cfg, "train", store) as first:
        for step in range(1, 6):
            first.log("train", {"loss": 10.0 + step}, step)
        first.log("train/heldout", {"tau": 1.5}, 5)
    with open_tracker(cfg, "train", store) as resumed:
        assert resumed.last_steps == {"train": 5, "train/heldout": 5}
        for step in range(3, 9):
            resumed.log("train", {"loss": 20.0 + step}, step)  # replayed steps 3-5 differ only to tell them apart
    series = tensorboard_series(store, "train", "train/loss")
    assert [s for s, _ in series] == list(range(1, 9))
    assert dict(series)[4] == 14.0 and dict(series)[6] == 26.0


def test_rotated_event_files_read_back_in_order(cfg):
    """A long run's event file is rotated (rotate_bytes) so each flush uploads a bounded file; TensorBoard reads a
    folder's files in name order, so the names must sort by creation, also within one second and one process."""
    store = open_store(cfg.storage, cfg.run_id)
    with open_tracker(cfg, "train", store) as tracker:
        (sink,) = tracker.sinks
        sink.rotate_bytes = 1  # every flush starts a new file
        for step in range(1, 13):
            tracker.log("train", {"loss": float(step)}, step)
            tracker.flush()
    files = [k for k in store.list(layout.tensorboard_prefix("train")) if "tfevents" in k]
    assert len(files) >= 12
    assert tensorboard_series(store, "train", "train/loss") == [(s, float(s)) for s in range(1, 13)]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_tracker_that_cannot_reach_its_server_is_one_warning(cfg, monkeypatch, caplog):
    """MLflow pointed at a port nothing listens on (server down): one warning, TensorBoard goes on."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    cfg = cfg.with_overrides({"tracking.report_to": ["tensorboard", "mlflow"]})
    store = open_store(cfg.storage, cfg.run_id)
    with caplog.at_level(logging.WARNING, logger="flashdraft.tracking.tracker"):
        with open_tracker(cfg, "evaluate", store) as tracker:
            tracker.log("evaluate", {"tau": 2.5}, 1)
            tracker.log("evaluate", {"tau": 2.6}, 2)
    warnings = [r.getMessage() for r in caplog.records if "mlflow failed" in r.getMessage()]
    assert len(warnings) == 1 and "store keeps every figure" in warnings[0]
    assert tensorboard_series(store, "evaluate", "evaluate/tau") == [(1, 2.5), (2, 2.6)]


def test_mlflow_without_a_tracking_uri_says_which_variable(cfg, monkeypatch, caplog):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = cfg.with_overrides({"tracking.report_to": ["mlflow"]})
    with caplog.at_level(logging.WARNING, logger="flashdraft.tracking.tracker"):
        tracker = open_tracker(cfg, "train", open_store(cfg.storage, cfg.run_id))
    assert tracker.names == []
    assert "MLFLOW_TRACKING_URI is not set" in caplog.text


def test_no_trackers_writes_nothing(cfg):
    cfg = cfg.with_overrides({"tracking.report_to": []})
    store = open_store(cfg.storage, cfg.run_id)
    with open_tracker(cfg, "train", store) as tracker:
        tracker.log("train", {"loss": 1.0}, 1)
    assert store.list(layout.TENSORBOARD) == []


def test_report_to_names_a_tracker_once(cfg):
    with pytest.raises(ConfigError, match="tracking.report_to names a tracker twice"):
        cfg.with_overrides({"tracking.report_to": ["mlflow", "mlflow"]})
    with pytest.raises(ConfigError, match="report_to"):
        cfg.with_overrides({"tracking.report_to": ["neptune"]})
