"""Training-side readers over committed feature shards, local or S3: `OfflineReader` (epochs) and `StreamReader`
(the streaming window). Both are IterableDatasets yielding `Sample`s; *how* bytes are read (headers, part cache,
prefetch threads) is `flashdraft.features.parts.PartFetcher`'s.

* Order (offline): per (seed, epoch) parts are permuted, each part's samples permuted, and a shuffle buffer mixes
  neighbouring parts, all in index space: deterministic, no I/O, and `state_dict()` resumes by skipping exactly
  the consumed samples without reading them.
* Disjoint split: rank r takes positions r, r + world_size, ... (`even=True` cuts to a multiple of world_size so
  every data-parallel rank sees the same count); DataLoader workers split that share again, so a rank's samples
  do not depend on its worker count.
* Streaming: parts in commit order as they appear, each `reuse` times, until end-of-stream; a `WindowConsumer`
  deletes used parts. With `defer_release=True` (the trainer) a part is released only by
  `release_through(position)` once a checkpoint covers it, and `follow_state()` / `resume_follow()` carry the
  position across a restart, so resume is exact, unless the window fills before the next checkpoint: then the
  reader releases early and warns (the producer would otherwise wait on us while we wait on it).
* Decoding: by the reader's threads, or with `defer_decode=True` (`training.feature_decode`) a device codec (q4)
  yields `shard.EncodedFeatures` for the trainer to decode on its GPU (`Sample.decoded(device)`).

Use `DataLoader(reader, batch_size=None, num_workers=0)` (the reader has its own threads): exact resume and the
streaming window's release both need num_workers=0.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable, Iterator

import torch

from flashdraft.config import RunConfig
from flashdraft.features.manifest import RecordedPart, committed_parts, expected_provenance, recorded_parts
from flashdraft.features.parts import PART_CACHE_BYTES, Drain, Event, Fetch, PartEnd, PartFetcher
from flashdraft.features.shard import Sample, ShardHeader
from flashdraft.features.window import WindowConsumer, WindowTimeout
from flashdraft.storage.source import data_store
from flashdraft.storage.store import ObjectStore

log = logging.getLogger(__name__)


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


class _Reader(torch.utils.data.IterableDataset):
    """What both readers share: the fetcher, the seed and this rank's (and loader worker's) share."""

    def __init__(self, store: ObjectStore, *, expected_provenance: dict | None, seed: int, shuffle: bool,
                 rank: int, world_size: int, even: bool, prefetch: int, threads: int, whole_parts: bool | None,
                 part_cache_bytes: int, defer_decode: bool, recorded: list[RecordedPart] | None = None):
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.store, self.seed, self.shuffle = store, seed, shuffle
        self.rank, self.world_size, self.even = rank, world_size, even
        self.parts = PartFetcher(store, expected_provenance=expected_provenance, prefetch=prefetch,
                                 threads=threads, whole_parts=whole_parts, part_cache_bytes=part_cache_bytes,
                                 defer_decode=defer_decode, recorded=recorded)
        self._consumed = 0  # samples this worker yielded in the current epoch (or stream)

    def header(self, key: str) -> ShardHeader:
        return self.parts.header(key)

    def fetch(self, key: str, index: int) -> Sample:
        return self.parts.fetch(key, index)

    def _split(self, items: list) -> list:
        """This rank's share (every world_size-th item), then this loader worker's share of it."""
        info = torch.utils.data.get_worker_info()
        n, w = (info.num_workers, info.id) if info is not None else (1, 0)
        return items[self.rank::self.world_size][w::n]

    def reads_whole_parts(self) -> bool:
        """Whole-part GETs unless set explicitly: only when this worker takes every sample of each part."""
        if self.parts.whole_parts is not None:
            return self.parts.whole_parts
        info = torch.utils.data.get_worker_info()
        return self.world_size == 1 and (info is None or info.num_workers == 1)

    def _fetches(self, items: Iterable[tuple[str, int]]) -> list[Fetch]:
        """`Fetch` events for `items`, registered for whole-part reads before any of them is fetched."""
        fetches = [Fetch(key, index) for key, index in items]
        self.parts.plan(fetches, self.reads_whole_parts())
        return fetches

    def _run(self, events: Iterable[Event]) -> Iterator[Sample]:
        for sample in self.parts.run(events, self._part_end):
            self._consumed += 1
            yield sample

    def _part_end(self, event: PartEnd) -> None:
        """A part's last sample was yielded (only the streaming reader acts on it)."""


class OfflineReader(_Reader):
    """Epochs over the committed parts. Yields `Sample(sample_id, input_ids int64 [T], loss_mask bool [T],
    features bf16 [T, n*H])`.

    `parts`: the parts, in order, as extract's DONE records list them (`manifest.recorded_parts`; training passes
    them, computed once on rank 0 and broadcast, so every rank orders the same list): each is checked against its
    record before its header is read. Without them (tools, tests) the store's listing of committed parts."""

    def __init__(self, store: ObjectStore, *, expected_provenance: dict | None = None, seed: int = 0,
                 shuffle: bool = True, shuffle_buffer: int = 256, rank: int = 0, world_size: int = 1,
                 even: bool = True, prefetch: int = 8, threads: int = 4, whole_parts: bool | None = None,
                 part_cache_bytes: int = PART_CACHE_BYTES, defer_decode: bool = False,
                 parts: list[RecordedPart] | None = None):
        super().__init__(store, expected_provenance=expected_provenance, seed=seed, shuffle=shuffle, rank=rank,
                         world_size=world_size, even=even, prefetch=prefetch, threads=threads,
                         whole_parts=whole_parts, part_cache_bytes=part_cache_bytes, defer_decode=defer_decode,
                         recorded=parts)
        self.recorded = parts
        self.buffer = shuffle_buffer
        self.epoch = 0
        self._resume_from = 0
        self.exclude: frozenset[str] = frozenset()  # sample ids never yielded (the trainer's held-out samples)

    def part_keys(self) -> list[str]:
        """The parts every epoch reads, in (generation shard, part) order."""
        return [p.key for p in self.recorded] if self.recorded is not None else committed_parts(self.store)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "consumed": self._consumed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"reader state was saved with seed {state['seed']}, this reader has seed {self.seed}")
        self.epoch = int(state["epoch"])
        self._consumed = self._resume_from = int(state["consumed"])

    def epoch_order(self, epoch: int | None = None) -> list[tuple[str, int]]:
        """The full (part key, sample index) order of an epoch, before the split across workers."""
        keys = self.part_keys()
        self.parts.headers(keys)
        rng = random.Random(f"{self.seed}:{self.epoch if epoch is None else epoch}")
        if self.shuffle:
            rng.shuffle(keys)
        order = []
        for key in keys:
            idx = [i for i, info in enumerate(self.header(key).samples) if info.sample_id not in self.exclude]
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
        """Samples this rank yields per epoch."""
        return len(self.epoch_order()[self.rank::self.world_size])

    def __iter__(self) -> Iterator[Sample]:
        skip = self._resume_from
        self._consumed, self._resume_from = skip, 0
        yield from self._run(self._fetches(self.worker_order()[skip:]))
        self.epoch += 1
        self._consumed = 0


class StreamReader(_Reader):
    """The streaming window: parts in commit order as they appear, `reuse` passes each, until end of stream."""

    def __init__(self, store: ObjectStore, *, expected_provenance: dict | None = None, seed: int = 0,
                 shuffle: bool = True, rank: int = 0, world_size: int = 1, even: bool = True, prefetch: int = 8,
                 threads: int = 4, whole_parts: bool | None = None, part_cache_bytes: int = PART_CACHE_BYTES,
                 reuse: int = 1, window: WindowConsumer | None = None, poll_s: float = 1.0,
                 timeout_s: float | None = 3600.0, defer_release: bool = False, defer_decode: bool = False):
        super().__init__(store, expected_provenance=expected_provenance, seed=seed, shuffle=shuffle, rank=rank,
                         world_size=world_size, even=even, prefetch=prefetch, threads=threads,
                         whole_parts=whole_parts, part_cache_bytes=part_cache_bytes, defer_decode=defer_decode)
        self.reuse, self.window = reuse, window
        self.poll_s, self.timeout_s = poll_s, timeout_s
        self.defer_release = defer_release
        self._resume_from = 0
        self._open_parts: list[str] = []    # parts taken up and not yet released, in stream order
        self._pending: list[tuple[str, int, int]] = []  # (key, stream position after it, this worker's samples)
        self._released_samples = 0          # this worker's samples in parts already released
        self._replay: list[str] = []        # resume_follow: parts to take up first, in this order
        self._early_releases = 0            # releases forced by a full window (the first one warns)

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

    def __iter__(self) -> Iterator[Sample]:
        yield from self._run(self._events())

    def _new_parts(self, seen: set[str]) -> list[str]:
        new = [k for k in committed_parts(self.store) if k not in seen]
        if self.window is not None:  # parts this worker finished before a restart, still held by others
            new = [k for k in new if not self.window.done_by_me(k)]
        return new

    def _events(self) -> Iterator[Event]:
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
                new = self._new_parts(seen)
            if not new:
                if ended:
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise WindowTimeout(f"no new feature shard for {self.timeout_s} s and no end-of-stream marker")
                yield Drain()  # finish everything in flight, so every finished part is pending release
                self._release_early_if_window_full()
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
                    yield from self._fetches((key, i) for i in take)
                yield PartEnd(key, mine_total)

    def _release_early_if_window_full(self) -> None:
        """The producer waits on a full window while we wait on it: release finished parts before a checkpoint
        covers them (resume is then no longer exact; the first time warns)."""
        if not (self._pending and self.window is not None and self.window.full()):
            return
        log.log(logging.INFO if self._early_releases else logging.WARNING,
                "the streaming window is full before a checkpoint covered parts %s: releasing them now, so a "
                "resume from the last checkpoint will skip their samples (lower training.checkpoint_every or "
                "raise mode.window_bytes)", [k for k, _, _ in self._pending])
        self._early_releases += 1
        self.release_through(self._consumed)

    def _part_end(self, event: PartEnd) -> None:
        """All of this worker's samples of the part were yielded: release it now, or when a checkpoint covers it."""
        self._pending.append((event.key, self._consumed, event.samples))
        if not self.defer_release:
            self.release_through(self._consumed)

    def _release(self, key: str) -> None:
        self.parts.forget(key)
        if self.window is not None:
            self.window.part_done(key)


def open_reader(cfg: RunConfig, *, rank: int = 0, world_size: int = 1, follow: bool | None = None,
                defer_release: bool = False, parts: list[RecordedPart] | None = None,
                **kwargs) -> OfflineReader | StreamReader:
    """The reader a trainer uses: the run's data store (a `data.features_from` source's), provenance checked
    against `cfg`, streaming per `cfg.mode` (`defer_release`: streaming parts are released by `release_through`,
    after the checkpoint covering them; `defer_decode` in kwargs: see the module docstring). Offline, `parts` is
    the part list (default: `recorded_parts` of the data store, read here)."""
    store = data_store(cfg)
    streaming = cfg.mode.kind == "streaming" if follow is None else follow
    kwargs.setdefault("seed", cfg.training.seed)
    common = dict(expected_provenance=expected_provenance(cfg), rank=rank, world_size=world_size)
    if not streaming:
        parts = recorded_parts(store, cfg.data.num_shards) if parts is None else parts
        return OfflineReader(store, **common, parts=parts, **kwargs)
    kwargs.setdefault("reuse", cfg.mode.reuse)
    kwargs.setdefault("window", WindowConsumer(store, workers=world_size, worker=rank, mode=cfg.mode))
    return StreamReader(store, **common, defer_release=defer_release, **kwargs)
