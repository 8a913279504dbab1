"""Extraction: target prefill over prompt+response ids -> hidden states of the DFlash layers -> committed shards.

One call handles one generation shard K (`responses/shard-K/`) and writes `features/shard-K/part-PPPPP.fds`:

* Only needed work: the target is loaded with `max(layer_ids) + 1` decoder layers and the forward stops after the
  deepest one (no final norm, lm_head or logits).
* Length-bucketed forwards: a batch of up to `features.batch_tokens` tokens is sorted by length and cut into
  right-padded forwards of at most `features.forward_tokens` padded tokens with no attention mask: under causal
  attention no real token sees the padding after it, so the features are exact and attention takes its mask-free
  path (faster than padding-free packing: docs/hidden-states.md).
* A writer thread encodes and commits finished batches from a bounded queue (`features.queue_depth`), so compute
  overlaps compression and upload, with backpressure when the store is slow.
* Exactly-once: a part closes at the first sample boundary where it holds >= `features.shard_bytes`, a pure
  function of the inputs. A rerun packs the same batches from the shard's start, skips those inside committed
  parts and recomputes the one straddling the resume point (keeping only its uncommitted samples), so the bytes
  are identical; an uncommitted part is rewritten. `features/shard-K/DONE` marks a finished shard for readers.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterator

import torch

from flashdraft.components.extract.source import ExtractionError, FeatureSource, Row
from flashdraft.components.extract.summary import ExtractSummary, PartStats
from flashdraft.config import RunConfig
from flashdraft.features.codecs import Codec
from flashdraft.features.manifest import (
    build_manifest,
    codec_from_config,
    committed_parts,
    make_provenance,
    part_stats,
)
from flashdraft.features.shard import HEADER_PROBE, build_shard, encode_sample, header_length, parse_header
from flashdraft.features.window import WindowProducer, released_part
from flashdraft.run.records import iter_responses
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore, io_counters, open_store

log = logging.getLogger(__name__)

# Test hook: exit the process (as a kill would) after writing part N's bytes but before its commit record.
FAULT_ENV = "FLASHDRAFT_FAULT_EXTRACT_KILL_AT_PART"


def load_rows(store: ObjectStore, shard: int, vocab_size: int) -> tuple[list[Row], int]:
    """Committed responses of generation shard `shard`, validated; rows without loss tokens are dropped."""
    rows, skipped = [], 0
    for r in iter_responses(store, shard):
        ids, mask = list(r["input_ids"]), list(r["loss_mask"])
        if len(ids) != len(mask):
            raise ExtractionError(f"responses shard {shard}, sample {r['sample_id']}: {len(ids)} input_ids but "
                                  f"{len(mask)} loss_mask entries")
        if ids and (min(ids) < 0 or max(ids) >= vocab_size):
            raise ExtractionError(f"responses shard {shard}, sample {r['sample_id']}: token id out of range "
                                  f"[0, {vocab_size})")
        if not ids or not any(mask):
            skipped += 1
            continue
        rows.append(Row(r["sample_id"], ids, mask))
    return rows, skipped


def pack_batches(rows: list[Row], batch_tokens: int) -> Iterator[list[Row]]:
    """Greedy in-order packing (a sample longer than the budget gets a batch of its own)."""
    batch, tokens = [], 0
    for row in rows:
        if batch and tokens + len(row.input_ids) > batch_tokens:
            yield batch
            batch, tokens = [], 0
        batch.append(row)
        tokens += len(row.input_ids)
    if batch:
        yield batch


def length_buckets(lengths: list[int], forward_tokens: int) -> list[list[int]]:
    """Sample indices sorted by length (ties in input order), cut into groups whose padded size (members x
    longest) stays within `forward_tokens`; a longer sample forms a group alone. A pure function of the input."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        if groups and (len(groups[-1]) + 1) * lengths[i] <= forward_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class HFFeatureSource:
    """Length-bucketed prefill through a truncated HF target with hooks on the configured layers (a
    `FeatureSource`, components/extract/source.py)."""

    def __init__(self, cfg: RunConfig, layer_ids: list[int], device: str):
        from transformers.utils import logging as hf_logging

        from flashdraft.target.model import load_causal_lm

        target = cfg.target
        if device.startswith("cuda"):
            target = target.model_copy(update={"dtype": "bfloat16"})
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the skipped deeper layers would be reported as "unexpected" weights
        try:
            self.model = load_causal_lm(target, device=device, num_layers=max(layer_ids) + 1)
        finally:
            hf_logging.set_verbosity(verbosity)
        self.layer_ids = layer_ids
        self.device = device
        self.forward_tokens = cfg.features.forward_tokens_on(device)

    def features(self, batch: list[Row]) -> list[torch.Tensor]:
        """Per-sample [T, n, H] CPU bf16 features; fails loudly if a forward returns fewer positions than given."""
        from flashdraft.target.capture import capture_layers

        lengths = [len(r.input_ids) for r in batch]
        out: list[torch.Tensor] = [torch.empty(0)] * len(batch)
        with capture_layers(self.model, self.layer_ids, stop_after_deepest=True) as cap:
            for group in length_buckets(lengths, self.forward_tokens):
                width = lengths[group[-1]]
                ids = torch.zeros((len(group), width), dtype=torch.long)  # right padding, never attended to
                for row, i in enumerate(group):
                    ids[row, : lengths[i]] = torch.tensor(batch[i].input_ids)
                cap.forward(input_ids=ids.to(self.device))
                grid = cap.features()  # [G, W, n*H]
                if tuple(grid.shape[:2]) != (len(group), width):
                    raise ExtractionError(f"captured a {tuple(grid.shape[:2])} grid for samples "
                                          f"{[batch[i].sample_id for i in group]} padded to ({len(group)}, {width}): "
                                          "truncation or drift")
                grid = grid.to("cpu", torch.bfloat16)
                for row, i in enumerate(group):
                    out[i] = grid[row, : lengths[i]].reshape(lengths[i], len(self.layer_ids), -1)
        return out

    def close(self) -> None:
        self.model = None


def _resume_point(store: ObjectStore, shard: int, rows: list[Row]) -> tuple[int, int]:
    """(next part index, samples already committed) from the contiguous committed parts of this shard."""
    done_parts = {k for k in committed_parts(store) if k.startswith(layout.feature_shard_prefix(shard))}
    part, skip = 0, 0
    while True:
        key = layout.feature_part_key(shard, part)
        if key not in done_parts:
            released = released_part(store, key)  # streaming: already consumed and deleted by the trainer
            if released is None:
                break
            skip += released["samples"]
            part += 1
            continue
        head = store.get(key, 0, HEADER_PROBE)
        end = header_length(head, key)
        header = parse_header(head if len(head) >= end else store.get(key, 0, end), key)
        got = [s.sample_id for s in header.samples]
        want = [r.sample_id for r in rows[skip:skip + len(got)]]
        if got != want:
            raise ExtractionError(f"{key} holds samples {got[:3]}... but the responses now give {want[:3]}...: "
                                  "the responses changed since this shard was extracted; delete features/ for it")
        skip += len(got)
        part += 1
    return part, skip


class ShardWriter(threading.Thread):
    """Encodes batches and commits parts off the compute thread; a bounded queue gives backpressure."""

    def __init__(self, store: ObjectStore, shard: int, first_part: int, codec: Codec, layer_ids: list[int],
                 hidden: int, provenance: dict, shard_bytes: int, depth: int, window: WindowProducer | None = None):
        super().__init__(name=f"extract-writer-{shard}", daemon=True)
        self.store, self.shard, self.part = store, shard, first_part
        self.codec, self.layer_ids, self.hidden, self.provenance = codec, layer_ids, hidden, provenance
        self.shard_bytes, self.window = shard_bytes, window
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.pending: list[tuple[str, int, bytes]] = []
        self.pending_bytes = 0
        self.committed: list[dict] = []
        self.fault_part = int(os.environ[FAULT_ENV]) if os.environ.get(FAULT_ENV) else None

    def submit(self, item) -> None:
        while True:
            if self.error is not None:
                raise ExtractionError(f"shard writer failed: {self.error}") from self.error
            try:
                self.queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        try:
            while (item := self.queue.get()) is not None:
                batch, feats = item
                for row, f in zip(batch, feats, strict=True):
                    blob = encode_sample(self.codec, row.input_ids, row.loss_mask, f)
                    self.pending.append((row.sample_id, len(row.input_ids), blob))
                    self.pending_bytes += len(blob)
                    if self.pending_bytes >= self.shard_bytes:
                        self._commit_part()
            if self.pending:
                self._commit_part()
        except BaseException as exc:  # noqa: BLE001 - handed to the compute thread
            self.error = exc
            while True:  # drain so the producer never blocks on a dead writer
                try:
                    if self.queue.get(timeout=0.5) is None:
                        break
                except queue.Empty:
                    break

    def _commit_part(self) -> None:
        key = layout.feature_part_key(self.shard, self.part)
        data = build_shard(self.codec, self.layer_ids, self.hidden, self.provenance, self.pending)
        tokens = sum(t for _, t, _ in self.pending)
        meta = {"samples": len(self.pending), "tokens": tokens, "provenance": self.provenance}
        if self.window is not None:
            self.window.wait_for_room(len(data))
        if self.fault_part == self.part:
            self.store.put(key, data)
            log.error("fault injection (%s): exiting after writing %s without its commit record", FAULT_ENV, key)
            os._exit(137)
        record = self.store.commit(key, data, meta)
        self.committed.append({"key": key, "samples": len(self.pending), "tokens": tokens, "bytes": len(data),
                               "sha256": record.sha256})
        log.info("committed %s: %d samples, %d tokens, %.1f MB", key, len(self.pending), tokens, len(data) / 1e6)
        self.pending, self.pending_bytes = [], 0
        self.part += 1


def extraction_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_extract(cfg: RunConfig, shard: int) -> ExtractSummary:
    """Extract generation shard `shard` into committed feature shards; returns a JSON-able summary.

    In streaming mode (`mode.kind=streaming`) each part waits for room in the window; the job that completes
    the last shard writes the end-of-stream marker, and a failure writes the failure marker for the trainer."""
    if cfg.mode.kind != "streaming":
        return _extract(cfg, shard, None)
    store = open_store(cfg.storage, cfg.run_id)
    window = WindowProducer(store, cfg.mode)
    try:
        summary = _extract(cfg, shard, window)
    except Exception as exc:
        window.fail(f"extract shard {shard}: {type(exc).__name__}: {exc}")
        raise
    if all(store.is_committed(layout.features_done_key(k)) for k in range(cfg.data.num_shards)):
        window.finish()
    return summary


def _extract(cfg: RunConfig, shard: int, window: WindowProducer | None) -> ExtractSummary:
    from tqdm import tqdm

    from flashdraft.target.model import resolve_target, set_cpu_threads, tokenizer_fingerprint

    io0 = io_counters()
    store = open_store(cfg.storage, cfg.run_id)
    target = resolve_target(cfg)  # the model's own config (text_config of a multimodal one); ids checked in range
    geo, layer_ids = target.geometry, list(target.layer_ids)
    hidden = geo.hidden_size
    provenance = make_provenance(cfg, tokenizer_fingerprint(target.tokenizer()), hidden, layer_ids)
    rows, empty = load_rows(store, shard, geo.vocab_size)
    first_part, skip = _resume_point(store, shard, rows)
    if skip:
        log.info("resuming shard %d at part %d (%d samples already committed)", shard, first_part, skip)
    todo = rows[skip:]

    device = extraction_device()
    torch.manual_seed(0)
    set_cpu_threads(cfg, device)
    source = _feature_source(cfg, layer_ids, device) if todo else None
    writer = ShardWriter(store, shard, first_part, codec_from_config(cfg), layer_ids, hidden, provenance,
                         cfg.features.shard_bytes, cfg.features.queue_depth, window)
    writer.start()
    t0, tokens = time.perf_counter(), 0
    try:
        with tqdm(total=sum(len(r.input_ids) for r in todo), unit="tok", desc=f"extract shard {shard}",
                  disable=None) as bar:
            start = 0  # index of the batch's first sample in `rows`
            for batch in pack_batches(rows, cfg.features.batch_tokens):
                start, first = start + len(batch), start
                if start <= skip:
                    continue  # wholly committed before
                keep = slice(max(skip - first, 0), None)  # the straddling batch: only its uncommitted samples
                feats = source.features(batch)
                writer.submit((batch[keep], feats[keep]))
                n = sum(len(r.input_ids) for r in batch[keep])
                tokens += n
                bar.update(n)
    finally:
        writer.queue.put(None)
        writer.join()
        if source is not None:
            source.close()
    if writer.error is not None:
        raise ExtractionError(f"shard writer failed: {writer.error}") from writer.error
    elapsed = time.perf_counter() - t0

    parts = _part_stats(store, shard, writer.part)
    samples, stored_tokens, stored_bytes = (sum(p.samples for p in parts), sum(p.tokens for p in parts),
                                            sum(p.bytes for p in parts))
    summary = ExtractSummary(
        shard=shard, backend=cfg.features.backend, device=device, codec=codec_from_config(cfg).params(),
        layer_ids=layer_ids, samples=samples, tokens=stored_tokens, bytes=stored_bytes, parts=parts,
        skipped_empty_samples=empty, resumed_from_sample=skip, new_tokens=tokens, elapsed_s=round(elapsed, 3),
        tokens_per_s=round(tokens / elapsed, 1) if elapsed > 0 else None,
        bytes_per_token=round(stored_bytes / max(stored_tokens, 1), 2))
    store.commit_json(layout.features_done_key(shard), summary.dump())  # the DONE record: without store_io
    build_manifest(store)
    log.info("extract shard %d: %d samples, %d tokens, %.2f bytes/token, %.0f tok/s", shard, summary.samples,
             summary.tokens, summary.bytes_per_token, summary.tokens_per_s or 0)
    summary.store_io = io_counters(io0)
    return summary


def _part_stats(store: ObjectStore, shard: int, num_parts: int) -> list[PartStats]:
    """The stats of parts 0..num_parts-1, stored or (streaming) released."""
    out = []
    for p in range(num_parts):
        key = layout.feature_part_key(shard, p)
        rec = store.read_commit(key)
        stats = released_part(store, key) if rec is None else part_stats(rec)
        if stats is None:
            raise ExtractionError(f"{store.url(key)} vanished before the shard completed (neither committed nor "
                                  "released by the streaming consumer)")
        out.append(PartStats(key=key, samples=stats["samples"], tokens=stats["tokens"], bytes=stats["bytes"],
                             sha256=stats["sha256"]))
    return out


def _feature_source(cfg: RunConfig, layer_ids: list[int], device: str) -> FeatureSource:
    if cfg.features.backend == "vllm":
        from flashdraft.components.extract.vllm_backend import VLLMFeatureSource

        return VLLMFeatureSource(cfg, layer_ids)
    return HFFeatureSource(cfg, layer_ids, device)
