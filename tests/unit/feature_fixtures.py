"""Synthetic committed feature shards (real format, random values) for reader and window tests."""

from __future__ import annotations

import torch

from flashdraft.features.codecs import Codec
from flashdraft.features.manifest import expected_provenance, part_key
from flashdraft.features.shard import build_shard, encode_sample
from flashdraft.store import ObjectStore

_PROVENANCE: dict[str, dict] = {}


def provenance(cfg) -> dict:
    """The real provenance for `cfg` (tokenizer and config of the tiny target), cached per config."""
    key = cfg.model_dump_json()
    if key not in _PROVENANCE:
        _PROVENANCE[key] = expected_provenance(cfg)
    return _PROVENANCE[key]


def part_bytes(cfg, shard: int, part: int, n: int, hidden: int | None = None) -> tuple[bytes, dict]:
    g = torch.Generator().manual_seed(1000 * shard + part)
    codec = Codec(cfg.features.codec)
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
    """layout: generation shard -> samples per part. Returns the committed keys."""
    keys = []
    for shard, counts in layout.items():
        for part, n in enumerate(counts):
            data, meta = part_bytes(cfg, shard, part, n)
            store.commit(part_key(shard, part), data, meta)
            keys.append(part_key(shard, part))
    return keys
