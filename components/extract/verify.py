"""`flashdraft features verify`: do the stored features still equal what the target computes?

Picks N random committed samples, checks the sha256 of every part they live in and the provenance against the
config, re-runs each sample through a plain HF forward (`output_hidden_states=True`, the reference the layer-id
convention is defined by, rounded to bf16 like the stored features) and reports the relative RMS error per layer:
~0 for lossless codecs (only float reassociation from packing, ~1e-3 in fp32), fp8's quantisation step (~2-3%),
q4's (~8-10%). The codec registry says what each codec may show (`CodecSpec.verify_tolerance`).
"""

from __future__ import annotations

import random

import torch

from flashdraft.config import RunConfig
from flashdraft.features.manifest import ProvenanceError, check_provenance, committed_parts, expected_provenance
from flashdraft.features.shard import ShardFormatError, iter_shard, parse_header
from flashdraft.storage.store import ChecksumError, open_store


def run_verify(cfg: RunConfig, num_samples: int = 4, seed: int = 0, tolerance: float | None = None) -> dict:
    from flashdraft.target.model import load_causal_lm

    store = open_store(cfg.storage, cfg.run_id, read_only=True)
    keys = committed_parts(store)
    if not keys:
        return {"ok": False, "reason": f"no committed feature shards under {store.url('features/')}"}
    index = []  # (part key, sample position)
    for key in keys:
        index.extend((key, i) for i in range(store.read_commit(key).meta["samples"]))
    chosen = sorted(random.Random(seed).sample(index, min(num_samples, len(index))))
    expected = expected_provenance(cfg)
    tol = tolerance if tolerance is not None else cfg.features.codec_params().spec.verify_tolerance
    report: dict = {"codec": expected["codec"], "tolerance": tol, "checksums": {}, "samples": []}

    model = load_causal_lm(cfg.target)
    ids = expected["layer_ids"]
    for key in sorted({k for k, _ in chosen}):
        try:
            data = store.get_verified(key)
            samples = list(iter_shard(data, store.url(key)))
            report["checksums"][key] = "ok"
        except (ChecksumError, ShardFormatError) as exc:
            report["checksums"][key] = f"FAILED: {exc}"
            continue
        try:
            check_provenance(expected, parse_header(data, key).provenance, store.url(key))
        except ProvenanceError as exc:
            return {**report, "ok": False, "reason": str(exc)}
        for _, pos in (c for c in chosen if c[0] == key):
            s = samples[pos]
            with torch.inference_mode():
                hs = model(input_ids=s.input_ids[None], output_hidden_states=True).hidden_states
            stored = s.features.float().reshape(len(s.input_ids), len(ids), -1)
            errs = []
            for k, layer in enumerate(ids):
                ref = hs[layer + 1][0].to(torch.bfloat16).float()  # features are defined in bf16
                errs.append(float((stored[:, k] - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()))
            report["samples"].append({"part": key, "sample_id": s.sample_id, "tokens": len(s.input_ids),
                                      "rel_rms_error": dict(zip(map(str, ids), errs, strict=True))})
    worst = max((e for s in report["samples"] for e in s["rel_rms_error"].values()), default=0.0)
    failed = [k for k, v in report["checksums"].items() if v != "ok"]
    report["max_rel_rms_error"] = worst
    report["ok"] = not failed and worst <= tol
    if failed:
        report["reason"] = f"checksum failures in {failed}"
    elif worst > tol:
        report["reason"] = f"relative RMS error {worst:.4g} exceeds tolerance {tol}"
    return report
