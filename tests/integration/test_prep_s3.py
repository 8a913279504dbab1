"""Prep reads its source from a real S3 server and writes its shards there."""

import json

import pytest

from flashdraft.components.prep.prep import run_prep
from flashdraft.config import load_config
from flashdraft.storage.store import ObjectStore

pytestmark = pytest.mark.integration


def test_prep_reads_an_object_store_source(s3_storage):
    src = ObjectStore(s3_storage.root, s3_storage)
    rows = [{"prompt": f"Question number {i}: what is {i} squared?"} for i in range(6)]
    src.put("inputs/prompts.jsonl", "\n".join(json.dumps(r) for r in rows).encode() + b"\n{broken\n")
    cfg = load_config(preset="tiny", overrides={
        "storage.root": s3_storage.root, "storage.endpoint_url": s3_storage.endpoint_url,
        "data.sources": [{"uri": f"{s3_storage.root}/inputs/prompts.jsonl"}], "data.eval_count": 1,
        "data.num_shards": 1})
    summary = run_prep(cfg)
    assert (summary.kept, summary.bad_rows["invalid_json"], summary.num_train) == (6, 1, 5)
    assert src.is_committed(f"{cfg.run_id}/prompts/train-00000.parquet")
