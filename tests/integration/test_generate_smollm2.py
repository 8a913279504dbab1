"""Prep then generate every shard with the real SmolLM2-135M-Instruct (smollm2-local preset, small caps)."""

import pytest

from flashdraft.components.generate.generate import run_generate
from flashdraft.components.prep.prep import run_prep
from flashdraft.config import load_config
from flashdraft.records import iter_responses
from flashdraft.store import open_store
from flashdraft.target import load_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_smollm2_prep_and_generate_every_shard(tmp_path):
    cfg = load_config(preset="smollm2-local", overrides={
        "storage.root": f"file://{tmp_path}/runs", "data.max_samples": 6, "data.eval_count": 2,
        "data.num_shards": 2, "data.max_response_tokens": 32, "generation.chunk_size": 2,
        "generation.batch_size": 4})
    prep = run_prep(cfg)
    store = open_store(cfg.storage, cfg.run_id)
    tok = load_tokenizer(cfg.target)
    stopped = 0
    for shard in range(prep.num_shards):
        done = run_generate(cfg, shard)
        rows = list(iter_responses(store, shard))
        assert len(rows) == done.samples == prep.shard_rows[shard]
        for r in rows:
            assert r["response_text"].strip(), "a real chat model writes something"
            if r["finish_reason"] == "stop":
                stopped += 1
                assert r["input_ids"][-1] == tok.eos_token_id
    assert stopped >= 1, "with 32 tokens some answers should end on their own"
