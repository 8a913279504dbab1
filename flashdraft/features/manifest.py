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
from importlib import metadata

from flashdraft.config import RunConfig
from flashdraft.features.codecs import Codec
from flashdraft.storage import layout
from flashdraft.storage.store import CommitRecord, ObjectStore
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
