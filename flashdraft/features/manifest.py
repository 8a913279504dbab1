"""Provenance of a feature dataset, the dataset manifest, and the keys feature shards live at.

Hidden states are only meaningful for the exact target, tokenizer, chat template and layer ids that produced them;
a drafter trained on mismatching features trains fine and then accepts nothing. So every shard header carries the
provenance, and readers refuse shards whose provenance differs from the training config (`check_provenance`).

Keys (below the run's store root)::

    features/shard-KKKKK/part-PPPPP.fds   (+ .commit)   feature shards of generation shard K, in order
    features/shard-KKKKK/DONE             (+ .commit)   committed JSON when shard K is complete
    features/manifest.json                (+ .commit)   dataset manifest: provenance + per-part statistics
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata

from flashdraft.config import RunConfig
from flashdraft.features.codecs import Codec
from flashdraft.storage import layout
from flashdraft.storage.store import CommitRecord, NotCommittedError, ObjectStore, StoreError
from flashdraft.target.model import resolve_target, tokenizer_fingerprint

log = logging.getLogger(__name__)

# Fields that must match between the data and the training config (flashdraft_version is informational).
CHECKED_FIELDS = ("target_model", "target_revision", "target_source", "tokenizer_sha", "chat_template_sha",
                  "layer_ids", "hidden_size", "codec")


class ProvenanceError(ValueError):
    """Feature data made for a different target/tokenizer/layers/codec than the training config."""


def flashdraft_version() -> str:
    try:
        return metadata.version("flashdraft")
    except metadata.PackageNotFoundError:
        return "unknown"


def codec_from_config(cfg: RunConfig) -> Codec:
    return Codec.from_params(cfg.features.codec_params().as_dict())


def make_provenance(cfg: RunConfig, fingerprint: dict[str, str], hidden_size: int, layer_ids: list[int]) -> dict:
    """The provenance record for data made under `cfg` (fingerprint: target.tokenizer_fingerprint(tok))."""
    t = cfg.target
    model = t.model if t.source not in ("tiny", "random") else f"{t.model}@seed{t.seed}"
    return {"target_model": model, "target_revision": cfg.target.revision, "target_source": cfg.target.source,
            "tokenizer_sha": fingerprint["tokenizer_sha"], "chat_template_sha": fingerprint["chat_template_sha"],
            "layer_ids": list(layer_ids), "hidden_size": int(hidden_size), "codec": codec_from_config(cfg).params(),
            "flashdraft_version": flashdraft_version()}


def expected_provenance(cfg: RunConfig) -> dict:
    """What the training config expects (loads the tokenizer and the model config, not the weights)."""
    target = resolve_target(cfg)
    return make_provenance(cfg, tokenizer_fingerprint(target.tokenizer()), target.geometry.hidden_size,
                           list(target.layer_ids))


def check_provenance(expected: dict, found: dict, where: str) -> None:
    """Raise ProvenanceError listing every mismatching field, naming the data that carries it."""
    bad = [f"{k}: data has {found.get(k)!r}, config expects {expected.get(k)!r}"
           for k in CHECKED_FIELDS if found.get(k) != expected.get(k)]
    if bad:
        raise ProvenanceError(f"{where} was extracted for a different setup and cannot train this config:\n  "
                              + "\n  ".join(bad)
                              + "\n(re-run extraction for this config, or point the run at the matching data)")
    if found.get("flashdraft_version") != expected.get("flashdraft_version"):
        log.info("%s was written by flashdraft %s (this is %s)", where, found.get("flashdraft_version"),
                 expected.get("flashdraft_version"))


def part_stats(rec: CommitRecord) -> dict:
    """{samples, tokens, bytes, sha256} of a feature part from its commit record: what the manifest, the shard's
    DONE record and a streamed part's tombstone keep of it."""
    return {"samples": rec.meta.get("samples"), "tokens": rec.meta.get("tokens"), "bytes": rec.size,
            "sha256": rec.sha256}


def committed_parts(store: ObjectStore) -> list[str]:
    """Keys of every committed feature shard, in (generation shard, part) order."""
    return [k for k in store.list_committed(f"{layout.FEATURES}/") if k.endswith(layout.FEATURE_PART_SUFFIX)]


class PartListError(StoreError):
    """The feature parts extract recorded are not what the store holds (a shard not done, a part missing from
    the store or its listing, a part re-committed since it was recorded); the message names the part."""


@dataclass(frozen=True)
class RecordedPart:
    """One feature part as its shard's DONE record lists it: what offline training reads, and the bytes it must
    find there."""

    key: str
    sha256: str
    size: int
    record: str  # the DONE record listing it

    def to_json(self) -> list:
        return [self.key, self.sha256, self.size, self.record]

    @classmethod
    def from_json(cls, row: list) -> RecordedPart:
        return cls(str(row[0]), str(row[1]), int(row[2]), str(row[3]))


def recorded_parts(store: ObjectStore, num_shards: int) -> list[RecordedPart]:
    """Every part of shards 0..num_shards-1 in (shard, part) order, from the shards' DONE records read verified,
    each required in the store's listing of committed parts: a part a listing misses (an eventually consistent
    store, a source partly cleared) is refused by name, never silently left out of training. Each reader then
    checks the part's commit record against the recorded sha256 before reading it (`parts.PartFetcher`)."""
    parts: list[RecordedPart] = []
    for shard in range(num_shards):
        done = layout.features_done_key(shard)
        try:
            record = store.get_json_verified(done)
        except NotCommittedError:
            raise PartListError(f"{store.url(done)} is not committed: extraction of shard {shard} has not finished "
                                "(run extract for it first)") from None
        parts += [RecordedPart(p["key"], p["sha256"], int(p["bytes"]), done) for p in record.get("parts") or []]
    listed = set(committed_parts(store))
    missing = [p for p in parts if p.key not in listed]
    if missing:
        raise PartListError(f"{store.url(missing[0].key)} is recorded in {store.url(missing[0].record)} but the store "
                            f"does not list it as committed ({len(missing)} of {len(parts)} recorded parts missing): "
                            "training would silently skip it; restore it, or recompute the features "
                            "(run-local --from extract)")
    return parts


def check_unchanged(store: ObjectStore, part: RecordedPart) -> None:
    """Refuse `part` when the store no longer holds the bytes its DONE record lists (deleted, or re-committed
    with other bytes: its header and samples may differ from those the epoch order was computed from)."""
    now = store.read_commit(part.key)
    if now is None:
        raise PartListError(f"{store.url(part.key)} is recorded in {store.url(part.record)} but is no longer "
                            "committed in the store: restore it, or recompute the features (run-local --from extract)")
    if now.sha256 != part.sha256 or now.size != part.size:
        raise PartListError(f"{store.url(part.key)} was re-committed since {store.url(part.record)} recorded it "
                            f"(sha256 {part.sha256[:12]}… recorded, {now.sha256[:12]}… now): refusing to read it with "
                            "a stale header or order; restart training on the settled features (run-local --from "
                            "train)")


def build_manifest(store: ObjectStore) -> dict:
    """Rebuild and commit `features/manifest.json` from the committed parts' commit records.

    Derived data only, so concurrent extract jobs may each rebuild it; readers never depend on it."""
    parts, provenance = {}, None
    for key in committed_parts(store):
        rec = store.read_commit(key)
        if rec is None:  # deleted since listing (streaming consumer)
            continue
        parts[key] = part_stats(rec)
        provenance = provenance or rec.meta.get("provenance")
    manifest = {"provenance": provenance, "parts": parts,
                "totals": {"parts": len(parts), "samples": sum(p["samples"] or 0 for p in parts.values()),
                           "tokens": sum(p["tokens"] or 0 for p in parts.values()),
                           "bytes": sum(p["bytes"] for p in parts.values())}}
    store.commit_json(layout.FEATURES_MANIFEST, manifest)
    return manifest
