"""Training-side reader: an IterableDataset over committed feature shards, local or S3.

* Reads: one header range read per part. Then, when this worker takes every sample of a part (one rank, at
  most one loader worker: `whole_parts=None` picks this automatically), each part is read with one GET,
  sha256-verified against its commit record, and held until its last planned sample is decoded; at most
  `part_cache_bytes` (default 4 GiB) of parts are held, and a part beyond that is read by range. Otherwise
  each sample is one crc32-checked range GET, so a rank reads only its own bytes; at production sizes
  (Qwen3.6-27B, fp8-zstd: ~17 MB per 800-token sample) a request's fixed cost is noise. Either way `prefetch`
  fetches are in flight on a thread pool that also decodes.
* Order: per (seed, epoch) the parts are permuted, each part's samples permuted, and a shuffle buffer mixes
  neighbouring parts; all of this is computed in index space, so it is deterministic, costs no I/O, and resuming
  from `state_dict()` skips exactly the samples already consumed without reading them.
* Disjoint split: rank r takes positions r, r + world_size, ... of the epoch order (with `even=True` cut to a
  multiple of world_size, so every data-parallel rank sees the same count), and DataLoader workers split that
  share again, so a rank's samples do not depend on its worker count.
* Follow mode (streaming): parts are consumed in commit order as they appear, each `reuse` times, until the
  producer's end-of-stream marker; a `WindowConsumer` deletes fully used parts. With `defer_release=True` (the
  trainer) a used part is only released by `release_through(position)` once a checkpoint covers its samples, and
  `follow_state()` / `resume_follow()` carry the stream position across a restart, so a resumed run trains on
  exactly the samples an uninterrupted one would. If the window fills up before the next checkpoint (the
  producer waits on us while we wait on it), the reader releases early and warns: resume is then no longer exact.

Use it with `DataLoader(reader, batch_size=None, num_workers=0)` (the reader has its own threads). With more
loader workers, state_dict() only sees the main process (exact resume needs num_workers=0), and follow mode's
window release counts ranks, so streaming also needs num_workers=0.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from flashdraft.config import RunConfig
from flashdraft.features.manifest import check_provenance, committed_parts, expected_provenance
from flashdraft.features.shard import (
    HEADER_PROBE,
    Sample,
    ShardHeader,
    decode_sample,
    header_length,
    parse_header,
    sample_range,
)
from flashdraft.features.window import WindowConsumer, WindowTimeout
from flashdraft.store import ObjectStore, open_store

log = logging.getLogger(__name__)
_FLUSH = object()  # follow-mode marker: drain in-flight fetches before waiting for new shards
PART_CACHE_BYTES = 4 * 2**30  # whole parts one reader may hold at once (see _PartCache)


def read_header(store: ObjectStore, key: str) -> ShardHeader:
    head = store.get(key, 0, HEADER_PROBE)
    end = header_length(head, store.url(key))
    if len(head) < end:
        head = store.get(key, 0, end)
    return parse_header(head, store.url(key))


def shuffle_buffer(items: list, size: int, rng: random.Random) -> list:
    """The order a streaming shuffle buffer of `size` would produce (index space, no data)."""
    if size <= 1:
        return list(items)
    buf, out = [], []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        out.append(buf[j])
        buf[j] = item
    rng.shuffle(buf)
    return out + buf


class _PartCache:
    """Whole parts read with one GET each (sha256-verified against the commit record), kept only until this
    worker has decoded every sample it planned to take from them.

    A shuffle buffer keeps a few samples of many parts alive at once, so the bytes held are capped: a part that
    would take the cache past `budget_bytes` (while it holds anything) is served by per-sample range GETs instead,
    for all of its samples. Qwen3.6-27B parts are ~512 MB, so the cap is what keeps one rank's memory bounded."""

    def __init__(self, store: ObjectStore, budget_bytes: int):
        self.store, self.budget = store, budget_bytes
        self.lock = threading.Lock()
        self.slots: dict[str, dict] = {}
        self.held = 0

    def plan(self, items: list[tuple[str, int]]) -> None:
        with self.lock:
            for key, _ in items:
                slot = self.slots.setdefault(key, {"lock": threading.Lock(), "data": None, "remaining": 0,
                                                   "admitted": None, "size": 0})
                slot["remaining"] += 1

    def planned(self, key: str) -> bool:
        with self.lock:
            return key in self.slots

    def get(self, key: str, size: int) -> bytes | None:
        """The bytes of planned part `key`, or None when it is over budget (the caller reads by range)."""
        with self.lock:
            slot = self.slots[key]
            if slot["admitted"] is None:  # decided once per part, on its first fetch
                slot["admitted"] = self.held == 0 or self.held + size <= self.budget
                if slot["admitted"]:
                    slot["size"] = size
                    self.held += size
            if not slot["admitted"]:
                return None
        with slot["lock"]:
            if slot["data"] is None:
                slot["data"] = self.store.get_verified(key)
            return slot["data"]

    def used(self, key: str) -> None:
        with self.lock:
            slot = self.slots[key]
            slot["remaining"] -= 1
            if slot["remaining"] == 0:
                del self.slots[key]
                self.held -= slot["size"]


class FeatureReader(torch.utils.data.IterableDataset):
    """Yields `Sample(sample_id, input_ids int64 [T], loss_mask bool [T], features bf16 [T, n*H])`."""

    def __init__(self, store: ObjectStore, *, expected_provenance: dict | None = None, seed: int = 0,
                 shuffle: bool = True, shuffle_buffer: int = 256, rank: int = 0, world_size: int = 1,
                 even: bool = True, prefetch: int = 8, threads: int = 4, follow: bool = False, reuse: int = 1,
                 window: WindowConsumer | None = None, poll_s: float = 1.0, timeout_s: float | None = 3600.0,
                 whole_parts: bool | None = None, part_cache_bytes: int = PART_CACHE_BYTES,
                 defer_release: bool = False):
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.store, self.expected = store, expected_provenance
        self.seed, self.shuffle, self.buffer = seed, shuffle, shuffle_buffer
        self.rank, self.world_size, self.even = rank, world_size, even
        self.prefetch, self.threads = prefetch, threads
        self.follow, self.reuse, self.window = follow, reuse, window
        self.poll_s, self.timeout_s = poll_s, timeout_s
        self.epoch = 0
        self._consumed = 0          # samples this worker yielded in the current epoch (or stream)
        self._resume_from = 0
        self._headers: dict[str, ShardHeader] = {}
        self.whole_parts, self.part_cache_bytes = whole_parts, part_cache_bytes
        self._parts: _PartCache | None = None
        self.defer_release = defer_release
        self._open_parts: list[str] = []    # follow mode: parts taken up and not yet released, in stream order
        self._pending: list[tuple[str, int, int]] = []  # (key, stream position after it, this worker's samples)
        self._released_samples = 0          # this worker's samples in parts already released
        self._replay: list[str] = []        # resume_follow: parts to take up first, in this order
        self._early_releases = 0            # releases forced by a full window (the first one warns)

    # -- state ----------------------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._consumed, self._resume_from = epoch, 0, 0

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "consumed": self._consumed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"reader state was saved with seed {state['seed']}, this reader has seed {self.seed}")
        self.epoch = int(state["epoch"])
        self._consumed = self._resume_from = int(state["consumed"])

    def follow_state(self, position: int) -> dict:
        """The state that resumes this worker's stream at `position` (samples trained so far), assuming every
        part finished at or before it is released right after (see `release_through`)."""
        done, _ = self._covered(position)
        gone = {k for k, _, _ in done}
        return {"position": position, "released_samples": self._released_samples + sum(n for _, _, n in done),
                "open_parts": [k for k in self._open_parts if k not in gone], "releasing": sorted(gone)}

    def resume_follow(self, state: dict) -> None:
        """Continue the stream saved by `follow_state`: finish its releases, then replay its open parts in order
        and skip the samples of theirs already trained."""
        for key in state["releasing"]:  # a crash may have come between the checkpoint and these releases
            self._release(key)
        self._released_samples = int(state["released_samples"])
        self._consumed = int(state["position"])
        # below zero only after a window-forced early release dropped samples not yet trained (already warned)
        self._resume_from = max(0, self._consumed - self._released_samples)
        self._replay = list(state["open_parts"])

    def release_through(self, position: int) -> None:
        """Release every taken-up part whose samples all lie at or before stream `position`."""
        done, self._pending = self._covered(position)
        for key, _, n in done:
            self._released_samples += n
            self._open_parts.remove(key)
            self._release(key)

    def _covered(self, position: int) -> tuple[list, list]:
        """Pending parts split into (finished at or before `position`, the rest), in stream order."""
        return ([e for e in self._pending if e[1] <= position], [e for e in self._pending if e[1] > position])

    # -- index space ----------------------------------------------------------------------------------------
    def header(self, key: str) -> ShardHeader:
        if key not in self._headers:
            h = read_header(self.store, key)
            if self.expected is not None:
                check_provenance(self.expected, h.provenance, self.store.url(key))
            self._headers[key] = h
        return self._headers[key]

    def _split(self, items: list) -> list:
        """This rank's share (every world_size-th item), then this loader worker's share of it."""
        info = torch.utils.data.get_worker_info()
        n, w = (info.num_workers, info.id) if info is not None else (1, 0)
        return items[self.rank::self.world_size][w::n]

    def epoch_order(self, epoch: int | None = None) -> list[tuple[str, int]]:
        """The full (part key, sample index) order of an epoch, before the split across workers."""
        keys = committed_parts(self.store)
        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(self.header, keys))
        rng = random.Random(f"{self.seed}:{self.epoch if epoch is None else epoch}")
        if self.shuffle:
            rng.shuffle(keys)
        order = []
        for key in keys:
            idx = list(range(len(self._headers[key].samples)))
            if self.shuffle:
                rng.shuffle(idx)
            order.extend((key, i) for i in idx)
        if self.shuffle:
            order = shuffle_buffer(order, self.buffer, rng)
        if self.even:
            order = order[: len(order) - len(order) % self.world_size]
        return order

    def worker_order(self, epoch: int | None = None) -> list[tuple[str, int]]:
        return self._split(self.epoch_order(epoch))

    def __len__(self) -> int:
        """Samples this rank yields per epoch (offline mode)."""
        if self.follow:
            raise TypeError("a follow-mode reader has no length")
        return len(self.epoch_order()[self.rank::self.world_size])

    # -- data -----------------------------------------------------------------------------------------------
    def fetch(self, key: str, index: int) -> Sample:
        header = self.header(key)
        start, end = sample_range(header, index)
        if self._parts is None or not self._parts.planned(key):  # range read (also a direct, unplanned fetch)
            return decode_sample(header, index, self.store.get_chunked(key, start, end), self.store.url(key))
        try:
            part = self._parts.get(key, header.size)
            blob = self.store.get_chunked(key, start, end) if part is None else memoryview(part)[start:end]
            return decode_sample(header, index, blob, self.store.url(key), check_crc=part is None)
        finally:
            self._parts.used(key)

    def reads_whole_parts(self) -> bool:
        """Whole-part GETs unless set explicitly: only when this worker takes every sample of each part."""
        if self.whole_parts is not None:
            return self.whole_parts
        info = torch.utils.data.get_worker_info()
        return self.world_size == 1 and (info is None or info.num_workers == 1)

    def _plan(self, items: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Register `items` for whole-part reads (when this worker reads whole parts) before they are fetched."""
        if self.reads_whole_parts():
            if self._parts is None:
                self._parts = _PartCache(self.store, self.part_cache_bytes)
            self._parts.plan(items)
        return items

    def _stream(self, items: Iterator) -> Iterator[Sample]:
        """Fetch (key, index) items ahead on threads, yield in order. A callable item runs when it reaches the
        front, i.e. after every earlier fetch finished (used to release a consumed part)."""
        with ThreadPoolExecutor(self.threads, thread_name_prefix="feature-reader") as pool:
            pending: deque = deque()

            def pop() -> Iterator[Sample]:
                head = pending.popleft()
                if callable(head):
                    head()
                    return
                sample = head.result()
                self._consumed += 1
                yield sample

            for item in items:
                if item is _FLUSH:  # the source is about to wait: finish (and release) everything in flight
                    while pending:
                        yield from pop()
                    continue
                pending.append(item if callable(item) else pool.submit(self.fetch, *item))
                while len(pending) >= self.prefetch or (pending and callable(pending[0])):
                    yield from pop()
            while pending:
                yield from pop()

    def __iter__(self) -> Iterator[Sample]:
        if self.follow:
            yield from self._stream(self._follow_order())
            return
        skip = self._resume_from
        self._consumed, self._resume_from = skip, 0
        yield from self._stream(iter(self._plan(self.worker_order()[skip:])))
        self.epoch += 1
        self._consumed = 0

    def _follow_order(self) -> Iterator:
        """Parts in commit order as they appear (after any replayed ones), `reuse` passes each, then the part's
        end; stops at the end-of-stream marker."""
        seen: set[str] = set(self._replay)
        replay, self._replay = self._replay, []
        skip = self._resume_from
        self._resume_from = 0
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            ended = self.window.check() if self.window is not None else False
            if replay:
                missing = [k for k in replay if not self.store.is_committed(k)]
                if missing:
                    raise WindowTimeout(f"the checkpoint's stream position needs parts {missing} that are gone "
                                        "from the window; they cannot be replayed")
                new, replay = replay, []
            else:
                new = [k for k in committed_parts(self.store) if k not in seen]
                if self.window is not None:  # parts this worker finished before a restart, still held by others
                    new = [k for k in new if not self.window.done_by_me(k)]
            if not new:
                if ended:
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise WindowTimeout(f"no new feature shard for {self.timeout_s} s and no end-of-stream marker")
                yield _FLUSH  # finish everything in flight, so every finished part is pending release
                if self._pending and self.window is not None and self.window.full():
                    log.log(logging.INFO if self._early_releases else logging.WARNING,
                            "the streaming window is full before a checkpoint covered parts %s: releasing them "
                            "now, so a resume from the last checkpoint will skip their samples (lower "
                            "training.checkpoint_every or raise mode.window_bytes)", [k for k, _, _ in self._pending])
                    self._early_releases += 1
                    self.release_through(self._consumed)
                time.sleep(self.poll_s)
                continue
            deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
            for key in new:
                seen.add(key)
                self._open_parts.append(key)
                n = len(self.header(key).samples)
                mine_total = 0
                for p in range(self.reuse):
                    idx = list(range(n))
                    if self.shuffle:
                        random.Random(f"{self.seed}:{key}:{p}").shuffle(idx)
                    if self.even:
                        idx = idx[: n - n % self.world_size]
                    mine = self._split(idx)
                    mine_total += len(mine)
                    take = mine[skip:] if skip < len(mine) else []
                    skip = max(0, skip - len(mine))
                    yield from self._plan([(key, i) for i in take])
                yield lambda key=key, n=mine_total: self._part_finished(key, n)

    def _part_finished(self, key: str, samples: int) -> None:
        """All of this worker's samples of `key` were yielded: release it now, or when a checkpoint covers it."""
        self._pending.append((key, self._consumed, samples))
        if not self.defer_release:
            self.release_through(self._consumed)

    def _release(self, key: str) -> None:
        self._headers.pop(key, None)
        if self.window is not None:
            self.window.part_done(key)


def open_reader(cfg: RunConfig, *, rank: int = 0, world_size: int = 1, follow: bool | None = None,
                **kwargs) -> FeatureReader:
    """The reader a trainer uses: the run's store, provenance checked against `cfg`, streaming per `cfg.mode`."""
    store = open_store(cfg.storage, cfg.run_id)
    streaming = cfg.mode.kind == "streaming" if follow is None else follow
    kwargs.setdefault("seed", cfg.training.seed)
    if streaming:
        kwargs.setdefault("reuse", cfg.mode.reuse)
        kwargs.setdefault("window", WindowConsumer(store, workers=world_size, worker=rank, mode=cfg.mode))
    return FeatureReader(store, expected_provenance=expected_provenance(cfg), rank=rank, world_size=world_size,
                         follow=streaming, **kwargs)
