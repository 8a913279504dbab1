"""Synthetic committed feature shards (real format, random values) for reader and window tests."""

from __future__ import annotations

import torch

from flashdraft.features.manifest import codec_from_config, expected_provenance, part_stats
from flashdraft.features.shard import build_shard, encode_sample
from flashdraft.run.records import RESPONSE_SCHEMA, rows_to_table, table_to_parquet_bytes
from flashdraft.storage.layout import feature_part_key, features_done_key
from flashdraft.storage.store import ObjectStore, open_store

_PROVENANCE: dict[str, dict] = {}


def provenance(cfg) -> dict:
    """The real provenance for `cfg` (tokenizer and config of the tiny target), cached per config."""
    key = cfg.model_dump_json()
    if key not in _PROVENANCE:
        _PROVENANCE[key] = expected_provenance(cfg)
    return _PROVENANCE[key]


def part_bytes(cfg, shard: int, part: int, n: int, hidden: int | None = None) -> tuple[bytes, dict]:
    g = torch.Generator().manual_seed(1000 * shard + part)
    codec = codec_from_config(cfg)
    ids = cfg.layer_ids()
    h = hidden or cfg.target.hidden_size
    samples = []
    for i in range(n):
        t = int(torch.randint(3, 12, (1,), generator=g))
        feats = torch.randn(t, len(ids), h, generator=g).to(torch.bfloat16)
        tok = torch.randint(0, 1000, (t,), generator=g).tolist()
        samples.append((f"{shard}-{part}-{i}", t, encode_sample(codec, tok, [1] * t, feats)))
    prov = provenance(cfg)
    data = build_shard(codec, ids, h, prov, samples)
    return data, {"samples": n, "tokens": sum(t for _, t, _ in samples), "provenance": prov}


def commit_parts(store: ObjectStore, cfg, layout: dict[int, list[int]]) -> list[str]:
    """layout: generation shard -> samples per part. Commits the parts, then each shard's DONE record listing
    them as extract does (what offline training reads its part list from). Returns the committed keys."""
    keys = []
    for shard, counts in layout.items():
        parts = []
        for part, n in enumerate(counts):
            data, meta = part_bytes(cfg, shard, part, n)
            record = store.commit(feature_part_key(shard, part), data, meta)
            keys.append(feature_part_key(shard, part))
            parts.append({"key": keys[-1], **part_stats(record)})
        store.commit_json(features_done_key(shard), {"shard": shard, "parts": parts})
    return keys


def write_responses(cfg, shard=0, n=12, seed=0, chunk=5):
    """Committed response chunks as the generation stage writes them (random ids, varied lengths)."""
    g = torch.Generator().manual_seed(seed + shard)
    store = open_store(cfg.storage, cfg.run_id)
    rows = []
    for i in range(n):
        p, r = int(torch.randint(4, 30, (1,), generator=g)), int(torch.randint(1, 20, (1,), generator=g))
        ids = torch.randint(0, 49152, (p + r,), generator=g).tolist()
        rows.append({"sample_id": f"s{shard}-{i:03d}", "input_ids": ids, "loss_mask": [0] * p + [1] * r,
                     "prompt_len": p, "response_text": "x", "finish_reason": "stop"})
    for c in range(0, n, chunk):
        key = f"responses/shard-{shard:05d}/chunk-{c // chunk:05d}.parquet"
        store.commit(key, table_to_parquet_bytes(rows_to_table(rows[c:c + chunk], RESPONSE_SCHEMA)))
    return rows
