"""One writer per task (flashdraft/storage/lease.py) on a real filesystem store, through the runner: a second writer
is refused naming the holder, an expired or dead holder's lease is taken over, a stalled holder that lost it
commits nothing, and a task whose upstream still runs is refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from flashdraft.config import load_config
from flashdraft.run import status
from flashdraft.run.runner import UpstreamIncomplete, run_task
from flashdraft.storage import layout
from flashdraft.storage.lease import LeaseHeld, LeaseLost, TaskLease, lease_prefix
from flashdraft.storage.store import ObjectStore, open_store

HEARTBEAT_S, EXPIRY_S = 0.2, 1.5


def _store(tmp_path) -> ObjectStore:
    return ObjectStore(f"file://{tmp_path}/store").child("run")


def _lease(store: ObjectStore, task: str = "train") -> TaskLease:
    return TaskLease(store, task, expiry_s=EXPIRY_S, heartbeat_s=HEARTBEAT_S)


def test_create_exclusive_lets_exactly_one_of_many_racing_writers_create_a_key(tmp_path):
    store = _store(tmp_path)
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def take(i: int) -> None:
        barrier.wait()
        results.append(store.create_exclusive("leases/t/0000000001.json", f"writer {i}".encode()))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert store.get("leases/t/0000000001.json").startswith(b"writer ")  # whole, never empty
    assert store.list("leases/") == ["leases/t/0000000001.json"], "no temp file left behind"


def test_a_second_writer_of_a_live_lease_is_refused_in_one_line_naming_the_holder(tmp_path):
    store = _store(tmp_path)
    with _lease(store):
        t0 = time.monotonic()
        with pytest.raises(LeaseHeld) as refused:
            _lease(store).acquire()
        waited = time.monotonic() - t0
    message = str(refused.value)
    assert "\n" not in message and f"{socket.gethostname()} pid " in message and "train" in message, message
    assert waited < EXPIRY_S, "refused once it saw a renewal, without waiting for the expiry"


def test_a_released_lease_is_taken_at_once_and_records_the_release(tmp_path):
    store = _store(tmp_path)
    with _lease(store) as first:
        pass
    assert first.current().released
    t0 = time.monotonic()
    with _lease(store) as second:
        assert second.record.generation == 2
    assert time.monotonic() - t0 < HEARTBEAT_S
    assert store.list(lease_prefix("train")) == [f"{lease_prefix('train')}0000000002.json"], "history pruned"


def _dead_lease(store: ObjectStore, *, host: str, pid: int, expires_in_s: float, task: str = "train",
                generation: int = 1) -> None:
    now = time.time()
    record = {"task": task, "generation": generation, "token": "dead", "host": host, "pid": pid, "started": now - 60,
              "renewed": now, "expires": now + expires_in_s, "released": False,
              "pid_namespace": os.stat("/proc/self/ns/pid").st_ino}
    assert store.create_exclusive(f"{lease_prefix(task)}{generation:010d}.json", json.dumps(record).encode())


def test_a_lease_that_stops_being_renewed_is_taken_over_after_its_expiry(tmp_path, caplog):
    """A pod that died (another host, no heartbeat): a KFP retry waits for the expiry, then takes over."""
    store = _store(tmp_path)
    _dead_lease(store, host="flashdraft-train-pod-abc", pid=1, expires_in_s=3600)  # its clock says an hour
    t0 = time.monotonic()
    with _lease(store) as lease:
        waited = time.monotonic() - t0
        assert lease.record.generation == 2
    assert EXPIRY_S <= waited < EXPIRY_S + 2, waited
    assert any("took over the expired lease of flashdraft-train-pod-abc pid 1" in r.getMessage()
               for r in caplog.records)


def test_a_lease_past_its_expiry_or_of_a_dead_local_process_is_taken_at_once(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for folder, host, pid, expires_in_s in [("a", "elsewhere", 1, -1),  # its clock says it lapsed
                                            ("b", socket.gethostname(), int(gone.stdout), 3600)]:  # a killed run-local
        store = _store(tmp_path / folder)
        _dead_lease(store, host=host, pid=pid, expires_in_s=expires_in_s)
        t0 = time.monotonic()
        with _lease(store) as lease:
            assert lease.record.generation == 2
        assert time.monotonic() - t0 < EXPIRY_S, "taken without waiting for a renewal or the expiry"


def _cfg(tmp_path, **overrides):
    return load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store",
                                                 "storage.lease_heartbeat_s": HEARTBEAT_S,
                                                 "storage.lease_expiry_s": EXPIRY_S, **overrides})


def test_run_task_releases_its_lease_on_success_and_on_failure(tmp_path):
    cfg = _cfg(tmp_path)
    store = open_store(cfg.storage, cfg.run_id)
    run_task(cfg, "generate", 0, body=lambda: {"samples": 3})
    assert _lease(store, "generate-shard-00000").current().released

    def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_task(cfg, "generate", 1, body=boom)
    assert _lease(store, "generate-shard-00001").current().released


def test_a_second_run_task_of_a_running_task_is_refused_and_commits_nothing(tmp_path):
    cfg = _cfg(tmp_path)
    store = open_store(cfg.storage, cfg.run_id)
    started, finish = threading.Event(), threading.Event()

    def slow():
        started.set()
        finish.wait(30)
        return {"samples": 7}

    first = threading.Thread(target=run_task, args=(cfg, "generate", 0), kwargs={"body": slow})
    first.start()
    assert started.wait(30)
    with pytest.raises(LeaseHeld, match="another writer holds this task's lease"):
        run_task(cfg, "generate", 0, body=lambda: pytest.fail("the second writer ran"))
    finish.set()
    first.join(30)
    record = status.read_record(store, "generate", 0)
    assert record.state == "done" and record.figures["samples"] == 7 and record.attempt == 1


def test_a_writer_that_lost_its_lease_commits_no_result(tmp_path):
    """It stalled past the expiry and another writer took the task over: its result and records are not its own
    to commit (the taker's running record stays)."""
    cfg = _cfg(tmp_path)
    store = open_store(cfg.storage, cfg.run_id)

    def stalled():
        taker = _lease(store, "generate-shard-00000")
        assert taker._try_take(2)  # as a retry would once this one's lease expired
        time.sleep(3 * HEARTBEAT_S)  # this writer's next heartbeat sees the newer generation
        return {"samples": 5}

    with pytest.raises(LeaseLost, match="took the task over"):
        run_task(cfg, "generate", 0, body=stalled)
    record = status.read_record(store, "generate", 0)
    assert record.state == "running", "neither done nor failed committed by the writer that lost the lease"
    assert not store.is_committed(layout.metrics_key("generate-shard-00000"))


def test_train_started_while_an_extract_shard_runs_is_refused_never_recorded(tmp_path):
    cfg = _cfg(tmp_path)
    store = open_store(cfg.storage, cfg.run_id)
    store.commit_json(layout.PROMPTS_MANIFEST, {"summary": {"num_shards": 3}})
    run_task(cfg, "extract", 0, body=lambda: {"samples": 18, "tokens": 1600})
    started, finish = threading.Event(), threading.Event()

    def extracting():
        started.set()
        finish.wait(30)
        return {"samples": 18, "tokens": 1600}

    shard1 = threading.Thread(target=run_task, args=(cfg, "extract", 1), kwargs={"body": extracting})
    shard1.start()
    assert started.wait(30)
    with pytest.raises(UpstreamIncomplete) as refused:
        run_task(cfg, "train", body=lambda: pytest.fail("train ran on incomplete features"))
    finish.set()
    shard1.join(30)
    message = str(refused.value)
    assert "\n" not in message, message
    assert message.startswith("train: its upstream is not complete (extract-shard-00001 running, "
                              "extract-shard-00002 not started)"), message
    assert status.read_record(store, "train") is None, "nothing recorded for the refused train"
    run_task(cfg, "extract", 2, body=lambda: {"samples": 18, "tokens": 1600})
    run_task(cfg, "train", body=lambda: {"steps": 1})
    assert None not in status.read_record(store, "train").upstream.values(), "recorded with a known upstream"


def test_status_names_the_writer_of_a_running_task_or_says_it_stopped(tmp_path):
    from typer.testing import CliRunner

    from flashdraft.cli.main import app

    cfg = _cfg(tmp_path)
    store = open_store(cfg.storage, cfg.run_id)
    started, finish = threading.Event(), threading.Event()
    writer = threading.Thread(target=run_task, args=(cfg, "generate", 0),
                              kwargs={"body": lambda: (started.set(), finish.wait(30), {"samples": 1})[-1]})
    writer.start()
    assert started.wait(30)
    live = CliRunner().invoke(app, ["status", "--run", store.root], terminal_width=400).output
    finish.set()
    writer.join(30)
    assert "generate shard 0 running since" in live and f"written by {socket.gethostname()} pid " in live, live
    store.commit_json(status.status_key("generate", 0), status.read_record(store, "generate", 0).model_copy(
        update={"state": "running", "ended": None}).model_dump(mode="json"))  # its pod died before the end...
    _dead_lease(store, host="tiny-generate-pod", pid=7, expires_in_s=-1, task="generate-shard-00000",
                generation=99)  # ...and stopped renewing its lease
    dead = CliRunner().invoke(app, ["status", "--run", store.root], terminal_width=400).output
    assert "its writer tiny-generate-pod pid 7 stopped renewing its lease" in dead and "it takes over" in dead, dead
