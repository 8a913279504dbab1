"""Streaming window: hidden states live in the store only between production and their last use.

In streaming mode extraction and training run at the same time and the store holds a sliding window of shards
instead of the whole dataset (the point of the PRO 6000 / B200 split: tens of TB become a bounded buffer).

* Producer (extract): `WindowProducer.wait_for_room(nbytes)` blocks before a part is written while the committed
  parts already stored plus this one would exceed `mode.window_bytes` or `mode.window_shards`.
* Consumer (follow-mode reader): `WindowConsumer.part_done(key)` records that one reader worker finished its
  `mode.reuse` passes over a part; once every worker has, the part is uncommitted and deleted, leaving a small
  `released/` tombstone so a restarted producer resumes after it instead of producing it again.
* Markers under `features/_stream/` end the other side cleanly: `EOS` (producer finished: the consumer stops
  after the last part), `FAILED` (producer failure: the consumer raises with the message), `STOP` (the consumer
  stopped: a waiting producer raises instead of waiting forever). Every wait has a timeout.

The bound holds for one producer; P concurrent producers may each add one part beyond it.
"""

from __future__ import annotations

import logging
import time

from flashdraft.config import ModeConfig
from flashdraft.features.manifest import committed_parts, part_stats
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore

log = logging.getLogger(__name__)



class StreamFailed(RuntimeError):
    """The other side of the stream failed or stopped; the message says which and why."""


class WindowTimeout(TimeoutError):
    """Waited longer than the timeout for room in the window or for new shards."""


def stored_parts(store: ObjectStore) -> dict[str, int]:
    """Committed parts currently stored -> size in bytes."""
    out = {}
    for key in committed_parts(store):
        rec = store.read_commit(key)
        if rec is not None:
            out[key] = rec.size
    return out


def _marker_message(store: ObjectStore, key: str) -> str:
    try:
        return str(store.get_json(key).get("message", ""))
    except FileNotFoundError:
        return ""


def released_part(store: ObjectStore, key: str) -> dict | None:
    """Stats of a part the consumer already used up and deleted ({samples, tokens, bytes, sha256}), else None.

    The tombstone is committed and read back verified: its sha256 ends up in the shard's DONE record, so a
    byte flipped in flight must be re-read, not copied (the fault tests caught exactly that)."""
    tombstone = layout.stream_released_key(key)
    return store.get_json_verified(tombstone) if store.is_committed(tombstone) else None


class WindowProducer:
    def __init__(self, store: ObjectStore, mode: ModeConfig, poll_s: float = 1.0, timeout_s: float | None = 3600.0):
        self.store, self.mode, self.poll_s, self.timeout_s = store, mode, poll_s, timeout_s

    def wait_for_room(self, nbytes: int) -> None:
        if nbytes > self.mode.window_bytes:
            raise StreamFailed(f"a {nbytes}-byte shard can never fit mode.window_bytes={self.mode.window_bytes}: "
                               "lower features.shard_bytes or raise the window")
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        waited = False
        while True:
            if self.store.exists(layout.STREAM_STOP):
                stop = _marker_message(self.store, layout.STREAM_STOP)
                raise StreamFailed(f"the consumer stopped the stream: {stop}")
            parts = stored_parts(self.store)
            if sum(parts.values()) + nbytes <= self.mode.window_bytes and len(parts) + 1 <= self.mode.window_shards:
                if waited:
                    log.info("window has room again (%d parts, %d bytes stored)", len(parts), sum(parts.values()))
                return
            if deadline is not None and time.monotonic() > deadline:
                raise WindowTimeout(f"no room in the streaming window after {self.timeout_s} s ({len(parts)} parts, "
                                    f"{sum(parts.values())} bytes stored): is the trainer running?")
            if not waited:
                log.info("window full (%d parts, %d bytes): waiting for the trainer", len(parts), sum(parts.values()))
                waited = True
            time.sleep(self.poll_s)

    def finish(self) -> None:
        self.store.put_json(layout.STREAM_EOS, {"message": "producer finished"})

    def fail(self, message: str) -> None:
        self.store.put_json(layout.STREAM_FAILED, {"message": message})


class WindowConsumer:
    """`workers` = how many reader workers share each part (data-parallel ranks x loader workers); `mode` (the
    window's limits) lets the consumer tell when the producer is blocked on it."""

    def __init__(self, store: ObjectStore, workers: int = 1, worker: int = 0, mode: ModeConfig | None = None):
        self.store, self.workers, self.worker, self.mode = store, workers, worker, mode

    def done_by_me(self, key: str) -> bool:
        """This worker already finished `key` (other workers may still be using it)."""
        return self.store.exists(layout.stream_consumed_key(key, self.worker))

    def full(self) -> bool:
        """The producer cannot add another part as large as the largest stored one: it waits for a release."""
        if self.mode is None:
            return False
        parts = stored_parts(self.store)
        largest = max(parts.values(), default=0)
        return (sum(parts.values()) + largest > self.mode.window_bytes
                or len(parts) + 1 > self.mode.window_shards)

    def part_done(self, key: str) -> bool:
        """Mark `key` consumed by this worker; delete it once all workers have. True when it was deleted.
        Idempotent: finishing an already released part is a no-op."""
        marker = layout.stream_consumed_prefix(key)
        self.store.put(layout.stream_consumed_key(key, self.worker), b"")
        if len(self.store.list(marker)) < self.workers:
            return False
        rec = self.store.read_commit(key)
        if rec is not None:  # a tombstone, so a resumed producer knows this part existed
            self.store.commit_json(layout.stream_released_key(key), part_stats(rec))
        self.store.uncommit(key)
        for k in self.store.list(marker):
            self.store.delete(k)
        return True

    def check(self) -> bool:
        """True once the producer has finished; raises StreamFailed if it failed."""
        if self.store.exists(layout.STREAM_FAILED):
            raise StreamFailed(f"the producer failed: {_marker_message(self.store, layout.STREAM_FAILED)}")
        return self.store.exists(layout.STREAM_EOS)

    def stop(self, message: str) -> None:
        self.store.put_json(layout.STREAM_STOP, {"message": message})
