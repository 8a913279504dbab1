"""Fetching samples out of committed feature parts: headers, whole-part cache, and the prefetch pipeline.

Both readers (`flashdraft.features.reader`: offline epochs and the streaming window) decide *which* samples to
read and in what order; this module decides *how*:

* Headers: one range read per part (`read_header`), provenance-checked once, cached until the part is forgotten.
* Reads: when a reader takes every sample of a part (one rank, one loader worker), the part is read with one
  GET, sha256-verified against its commit record, and held until its last planned sample is decoded; at most
  `part_cache_bytes` (default 4 GiB) of parts are held, and a part beyond that is read by range. Otherwise each
  sample is one crc32-checked range GET, so a rank reads only its own bytes; at production sizes (Qwen3.6-27B,
  fp8-zstd: ~17 MB per 800-token sample) a request's fixed cost is noise.
* Prefetch: a reader describes its work as a sequence of explicit events (`Fetch`, `Drain`, `PartEnd`);
  `PartFetcher.run` keeps `prefetch` fetches in flight on a thread pool that also decodes, yields samples in
  event order, and calls back on a `PartEnd` only once every fetch before it has been yielded.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from flashdraft.features.manifest import RecordedPart, check_provenance, check_unchanged
from flashdraft.features.shard import (
    HEADER_PROBE,
    Sample,
    ShardFormatError,
    ShardHeader,
    decode_sample,
    header_length,
    parse_header,
    sample_range,
)
from flashdraft.storage.store import ChecksumError, ObjectStore

PART_CACHE_BYTES = 4 * 2**30  # whole parts one reader may hold at once (see PartCache)


@dataclass(frozen=True)
class Fetch:
    """Read and decode sample `index` of part `key`, in order."""
    key: str
    index: int


@dataclass(frozen=True)
class Drain:
    """The reader is about to wait (for new parts): yield everything in flight first."""


@dataclass(frozen=True)
class PartEnd:
    """Every sample this reader takes from `key` (`samples` of them) is before this event."""
    key: str
    samples: int


Event = Fetch | Drain | PartEnd


def read_header(store: ObjectStore, key: str) -> ShardHeader:
    head = store.get(key, 0, HEADER_PROBE)
    end = header_length(head, store.url(key))
    if len(head) < end:
        head = store.get(key, 0, end)
    return parse_header(head, store.url(key))


@dataclass
class _Slot:
    lock: threading.Lock
    remaining: int = 0
    admitted: bool | None = None  # decided once per part, on its first fetch
    size: int = 0
    data: bytes | None = None


class PartCache:
    """Whole parts read with one GET each (sha256-verified against the commit record), kept only until this
    reader has decoded every sample it planned to take from them.

    A shuffle buffer keeps a few samples of many parts alive at once, so the bytes held are capped: a part that
    would take the cache past `budget_bytes` (while it holds anything) is served by per-sample range GETs instead,
    for all of its samples. Qwen3.6-27B parts are ~512 MB, so the cap is what keeps one rank's memory bounded."""

    def __init__(self, store: ObjectStore, budget_bytes: int, recorded: dict[str, RecordedPart] | None = None):
        self.store, self.budget, self.recorded = store, budget_bytes, recorded or {}
        self.lock = threading.Lock()
        self.slots: dict[str, _Slot] = {}
        self.held = 0

    def plan(self, keys: Iterable[str]) -> None:
        with self.lock:
            for key in keys:
                self.slots.setdefault(key, _Slot(threading.Lock())).remaining += 1

    def planned(self, key: str) -> bool:
        with self.lock:
            return key in self.slots

    def get(self, key: str, size: int) -> bytes | None:
        """The bytes of planned part `key`, or None when it is over budget (the caller reads by range)."""
        with self.lock:
            slot = self.slots[key]
            if slot.admitted is None:
                slot.admitted = self.held == 0 or self.held + size <= self.budget
                if slot.admitted:
                    slot.size = size
                    self.held += size
            if not slot.admitted:
                return None
        with slot.lock:
            if slot.data is None:
                part = self.recorded.get(key)
                slot.data = self.store.get_verified(key) if part is None else \
                    self.store.get_expected(key, part.sha256, part.size, part.record)
            return slot.data

    def used(self, key: str) -> None:
        with self.lock:
            slot = self.slots[key]
            slot.remaining -= 1
            if slot.remaining == 0:
                del self.slots[key]
                self.held -= slot.size


class PartFetcher:
    """Headers, whole-part cache and prefetching for one reader (one rank, one loader worker)."""

    def __init__(self, store: ObjectStore, *, expected_provenance: dict | None = None, prefetch: int = 8,
                 threads: int = 4, whole_parts: bool | None = None, part_cache_bytes: int = PART_CACHE_BYTES,
                 defer_decode: bool = False, recorded: list[RecordedPart] | None = None):
        self.store, self.expected = store, expected_provenance
        # parts as extract's DONE records list them (offline training): each checked against its record
        self.recorded = {p.key: p for p in recorded or []}
        self.defer_decode = defer_decode  # leave device-decodable features encoded (shard.EncodedFeatures)
        self.prefetch, self.threads = prefetch, threads
        self.whole_parts = whole_parts
        self.cache = PartCache(store, part_cache_bytes, self.recorded) if whole_parts is not False else None
        self._headers: dict[str, ShardHeader] = {}

    def header(self, key: str) -> ShardHeader:
        if key not in self._headers:
            if key in self.recorded:  # its commit record still carries the recorded bytes: the header is theirs
                check_unchanged(self.store, self.recorded[key])
            h = read_header(self.store, key)
            if self.expected is not None:
                check_provenance(self.expected, h.provenance, self.store.url(key))
            self._headers[key] = h
        return self._headers[key]

    def headers(self, keys: list[str]) -> None:
        """Read the headers of `keys` in parallel (an epoch's order needs them all before the first sample)."""
        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(self.header, keys))

    def forget(self, key: str) -> None:
        """Drop a released part's header (streaming: parts come and go)."""
        self._headers.pop(key, None)

    def plan(self, items: list[Fetch], reads_whole_parts: bool) -> None:
        """Register `items` for whole-part reads (when the reader takes whole parts) before they are fetched."""
        if reads_whole_parts and self.cache is not None:
            self.cache.plan(item.key for item in items)

    def fetch(self, key: str, index: int) -> Sample:
        try:
            return self._fetch(key, index)
        except (ShardFormatError, ChecksumError):
            if key in self.recorded:  # a part re-committed since its header was read: say so, not "corrupt"
                check_unchanged(self.store, self.recorded[key])
            raise

    def _fetch(self, key: str, index: int) -> Sample:
        header = self.header(key)
        start, end = sample_range(header, index)
        if self.cache is None or not self.cache.planned(key):  # range read (also a direct, unplanned fetch)
            return decode_sample(header, index, self.store.get_chunked(key, start, end), self.store.url(key),
                                 defer=self.defer_decode)
        try:
            part = self.cache.get(key, header.size)
            blob = self.store.get_chunked(key, start, end) if part is None else memoryview(part)[start:end]
            return decode_sample(header, index, blob, self.store.url(key), check_crc=part is None,
                                 defer=self.defer_decode)
        finally:
            self.cache.used(key)

    def run(self, events: Iterable[Event], on_part_end: Callable[[PartEnd], None]) -> Iterator[Sample]:
        """Samples of the `Fetch` events in order, `prefetch` in flight; `on_part_end` runs when a `PartEnd`
        reaches the front (every earlier sample yielded); a `Drain` yields everything in flight first."""
        with ThreadPoolExecutor(self.threads, thread_name_prefix="feature-reader") as pool:
            pending: deque = deque()  # futures of samples, or PartEnd events, in event order

            def pop() -> Iterator[Sample]:
                head = pending.popleft()
                if isinstance(head, PartEnd):
                    on_part_end(head)
                else:
                    yield head.result()

            for event in events:
                if isinstance(event, Drain):
                    while pending:
                        yield from pop()
                    continue
                pending.append(event if isinstance(event, PartEnd) else pool.submit(self.fetch, event.key,
                                                                                      event.index))
                while len(pending) >= self.prefetch or (pending and isinstance(pending[0], PartEnd)):
                    yield from pop()
            while pending:
                yield from pop()
