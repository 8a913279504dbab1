"""vLLM extraction backend on CPU (vllm tier): same features as the hf backend, token counts checked."""

from __future__ import annotations

import pytest
import torch
from support.feature_fixtures import write_responses

from flashdraft.components.extract.extract import run_extract
from flashdraft.features.manifest import committed_parts
from flashdraft.features.shard import iter_shard
from flashdraft.storage.store import open_store

pytestmark = pytest.mark.vllm


def _samples(cfg):
    store = open_store(cfg.storage, cfg.run_id)
    return {s.sample_id: s for k in committed_parts(store) for s in iter_shard(store.get_verified(k), k)}


def test_vllm_backend_matches_hf_backend(tiny_cfg, vllm_python):
    hf = tiny_cfg.with_overrides({"run_id": "hf", "features.codec": "bf16"})
    vl = tiny_cfg.with_overrides({"run_id": "vllm", "features.codec": "bf16", "features.backend": "vllm",
                                  "generation.max_model_len": 256})
    for cfg in (hf, vl):
        write_responses(cfg, n=5)
    run_extract(hf, 0)
    summary = run_extract(vl, 0)
    assert summary.backend == "vllm" and summary.samples == 5
    a, b = _samples(hf), _samples(vl)
    assert a.keys() == b.keys()
    for sid in a:
        assert torch.equal(a[sid].input_ids, b[sid].input_ids)
        ref, got = a[sid].features.float(), b[sid].features.float()
        rel = (got - ref).norm() / ref.norm()
        assert rel < 2e-2, (sid, float(rel))
