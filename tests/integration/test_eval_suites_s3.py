"""An eval suite read from an s3:// URI through the real S3 server (the same loader as file:// suites)."""

from __future__ import annotations

import json

from flashdraft.components.evaluate.suites import load_suites
from flashdraft.config import load_config
from flashdraft.storage.store import ObjectStore, open_store


def _cfg(tmp_path, **overrides):
    return load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs", **overrides})


def _tok(cfg):
    from flashdraft.target.model import load_tokenizer

    return load_tokenizer(cfg.target)


def test_an_s3_suite_reads_through_the_real_s3_server(s3_storage, tmp_path):
    bucket = s3_storage.model_copy(update={"root": "s3://flashdraft-test/suites"})
    ObjectStore(bucket.root, bucket).put("mtbench.jsonl", json.dumps({"prompt": "Write a haiku."}).encode() + b"\n")
    cfg = _cfg(tmp_path, **{"storage.endpoint_url": s3_storage.endpoint_url,
                            "eval.suites": ["s3://flashdraft-test/suites/mtbench.jsonl"]})
    (suite,) = load_suites(cfg, open_store(cfg.storage, cfg.run_id), _tok(cfg))
    assert suite.name == "mtbench" and [p.prompt_id for p in suite.prompts] == ["mtbench-1"]
