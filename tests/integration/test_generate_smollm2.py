"""Prep then generate every shard with the real SmolLM2-135M-Instruct (the session's smollm2_run: smollm2-local
preset, small caps, 2 shards)."""

import pytest

from flashdraft.run.records import iter_responses
from flashdraft.storage.store import open_store
from flashdraft.target.model import load_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]


def test_smollm2_prep_and_generate_every_shard(smollm2_run):
    cfg, prep = smollm2_run.cfg, smollm2_run["prep"]
    store = open_store(cfg.storage, cfg.run_id)
    tok = load_tokenizer(cfg.target)
    stopped = 0
    assert prep.num_shards == 2
    for shard in range(prep.num_shards):
        done = smollm2_run["generated"][shard]
        rows = list(iter_responses(store, shard))
        assert len(rows) == done.samples == prep.shard_rows[shard]
        for r in rows:
            assert r["response_text"].strip(), "a real chat model writes something"
            if r["finish_reason"] == "stop":
                stopped += 1
                assert r["input_ids"][-1] == tok.eos_token_id
    assert stopped >= 1, "with 64 tokens some answers should end on their own"
