"""Streaming window: a producer thread and a follow-mode consumer keep the stored bytes within the window."""

from __future__ import annotations

import threading
import time

import pytest
from support.feature_fixtures import part_bytes

from flashdraft.config import ModeConfig
from flashdraft.features.manifest import committed_parts
from flashdraft.features.reader import StreamReader
from flashdraft.features.window import StreamFailed, WindowConsumer, WindowProducer
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore


def _stored_bytes(store: ObjectStore) -> int:
    total = 0
    for k in store.list("features/"):
        if k.startswith(layout.STREAM) or k.endswith(".commit"):
            continue
        try:
            total += store.size(k)
        except FileNotFoundError:  # deleted by the consumer since listing
            pass
    return total


def test_peak_stored_bytes_stay_within_the_window(tiny_cfg, tmp_path):
    store = ObjectStore(f"file://{tmp_path}/stream")
    parts = [part_bytes(tiny_cfg, 0, p, 3) for p in range(10)]
    biggest = max(len(d) for d, _ in parts)
    mode = ModeConfig(kind="streaming", window_bytes=3 * biggest, window_shards=3, reuse=2)
    peak, produced, stop = [0], [0], threading.Event()

    def monitor():
        while not stop.is_set():
            peak[0] = max(peak[0], _stored_bytes(store))
            time.sleep(0.002)

    def produce():
        producer = WindowProducer(store, mode, poll_s=0.01, timeout_s=30)
        for p, (data, meta) in enumerate(parts):
            producer.wait_for_room(len(data))
            store.commit(layout.feature_part_key(0, p), data, meta)
            produced[0] += len(data)
        producer.finish()

    threads = [threading.Thread(target=monitor), threading.Thread(target=produce)]
    for t in threads:
        t.start()
    consumer = WindowConsumer(store)
    reader = StreamReader(store, reuse=mode.reuse, window=consumer, poll_s=0.01, timeout_s=30)
    seen = []
    for s in reader:
        seen.append(s.sample_id)
        time.sleep(0.005)  # a trainer slower than the producer: the window must hold the producer back
    threads[1].join(timeout=30)
    stop.set()
    threads[0].join()
    assert len(seen) == 10 * 3 * mode.reuse and len(set(seen)) == 30
    assert produced[0] > 2 * mode.window_bytes
    assert 0 < peak[0] <= mode.window_bytes
    assert store.list_committed("features/shard-00000/") == []  # everything consumed was deleted


def test_producer_failure_ends_the_consumer_with_its_message(tiny_cfg):
    store = ObjectStore("memory://window-fail")
    data, meta = part_bytes(tiny_cfg, 0, 0, 2)
    store.commit(layout.feature_part_key(0, 0), data, meta)
    WindowProducer(store, ModeConfig()).fail("extract shard 3: CUDA out of memory")
    reader = StreamReader(store, window=WindowConsumer(store), poll_s=0.01, timeout_s=5)
    with pytest.raises(StreamFailed, match="CUDA out of memory"):
        list(reader)


def test_consumer_stop_ends_a_waiting_producer(tiny_cfg):
    store = ObjectStore("memory://window-stop")
    data, meta = part_bytes(tiny_cfg, 0, 0, 2)
    store.commit(layout.feature_part_key(0, 0), data, meta)
    producer = WindowProducer(store, ModeConfig(window_shards=1), poll_s=0.01, timeout_s=10)
    threading.Timer(0.1, lambda: WindowConsumer(store).stop("trainer reached max_steps")).start()
    with pytest.raises(StreamFailed, match="max_steps"):
        producer.wait_for_room(len(data))
    with pytest.raises(StreamFailed, match="never fit"):
        producer.wait_for_room(ModeConfig().window_bytes + 1)


def test_streaming_extract_with_a_concurrent_trainer_and_resume_after_release(tiny_cfg):
    from support.feature_fixtures import write_responses

    from flashdraft.components.extract.extract import run_extract
    from flashdraft.storage import layout

    cfg = tiny_cfg.with_overrides({"mode.kind": "streaming", "mode.window_shards": 2, "mode.reuse": 1,
                                   "features.shard_bytes": 30_000, "features.batch_tokens": 64,
                                   "data.num_shards": 1})
    rows = write_responses(cfg, n=10)
    store = ObjectStore(cfg.storage.root).child(cfg.run_id)
    reader = StreamReader(store, window=WindowConsumer(store), poll_s=0.02, timeout_s=120)
    seen = []
    consumer = threading.Thread(target=lambda: seen.extend(s.sample_id for s in reader))
    consumer.start()
    summary = run_extract(cfg, 0)
    consumer.join(timeout=120)
    assert store.exists(layout.STREAM_EOS) and sorted(seen) == sorted(r["sample_id"] for r in rows)
    assert summary.samples == len(rows) and len(summary.parts) > 2  # more parts than the window holds
    # A producer restarted after the trainer released every part must not produce them again.
    store.uncommit(layout.features_done_key(0))
    again = run_extract(cfg, 0)
    assert again.resumed_from_sample == len(rows) and again.new_tokens == 0
    assert committed_parts(store) == [] and again.parts == summary.parts


def test_deferred_release_gives_way_when_the_window_is_full(tiny_cfg, tmp_path, caplog):
    """A trainer that releases parts only at checkpoints must not deadlock a producer waiting for room."""
    store = ObjectStore(f"file://{tmp_path}/stream")
    parts = [part_bytes(tiny_cfg, 0, p, 3) for p in range(6)]
    mode = ModeConfig(kind="streaming", window_bytes=2 * max(len(d) for d, _ in parts), window_shards=2, reuse=1)

    def produce():
        producer = WindowProducer(store, mode, poll_s=0.01, timeout_s=30)
        for p, (data, meta) in enumerate(parts):
            producer.wait_for_room(len(data))
            store.commit(layout.feature_part_key(0, p), data, meta)
        producer.finish()

    thread = threading.Thread(target=produce)
    thread.start()
    reader = StreamReader(store, window=WindowConsumer(store, mode=mode), poll_s=0.01, timeout_s=20,
                           defer_release=True)  # and nobody calls release_through: no checkpoint ever comes
    with caplog.at_level("WARNING"):
        seen = [s.sample_id for s in reader]
    thread.join(timeout=30)
    assert len(seen) == 6 * 3 and "window is full before a checkpoint" in caplog.text


def test_a_restarted_worker_does_not_retake_a_part_it_finished(tiny_cfg):
    store = ObjectStore(f"memory://window-{id(tiny_cfg)}")
    for p in range(2):
        data, meta = part_bytes(tiny_cfg, 0, p, 4)
        store.commit(layout.feature_part_key(0, p), data, meta)
    WindowProducer(store, ModeConfig(kind="streaming")).finish()

    def rank(r: int) -> StreamReader:
        return StreamReader(store, rank=r, world_size=2, poll_s=0.01, timeout_s=5,
                             window=WindowConsumer(store, workers=2, worker=r))

    first = [s.sample_id for s in rank(0)]  # rank 0 finishes both parts; rank 1 has not started
    assert len(first) == 4 and len(committed_parts(store)) == 2  # kept for rank 1
    assert [s.sample_id for s in rank(0)] == []  # restarted: nothing of its own is left
    assert len([s.sample_id for s in rank(1)]) == 4 and committed_parts(store) == []


def test_window_monitor_counts_a_failed_listing_and_carries_on(tiny_cfg, monkeypatch):
    """The local streaming run's monitor (pipelines/runtime.py): a store that gives up (here a closed port, no
    retries) is counted in its figures, and the same thread then sees the parts once the store answers."""
    import socket

    from flashdraft.config import StorageConfig
    from flashdraft.pipelines.runtime import WindowMonitor

    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monitor = WindowMonitor(tiny_cfg, interval_s=0.01)
    good = monitor.store
    monitor.store = ObjectStore("s3://bkt/x", StorageConfig(root="s3://bkt/x", endpoint_url=f"http://127.0.0.1:{port}"),
                                retries=0)
    monitor.start()
    deadline = time.monotonic() + 20
    while monitor.failed_listings < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert monitor.failed_listings >= 2 and monitor.is_alive()
    data, meta = part_bytes(tiny_cfg, 0, 0, 2)
    good.commit(layout.feature_part_key(0, 0), data, meta)
    monitor.store = good
    while not monitor.seen and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = monitor.stop()
    assert stats["failed_listings"] >= 2 and stats["produced_parts"] == 1 and stats["peak_stored_bytes"] == len(data)
