"""The cluster's stream-end step: EOS only when every shard was extracted, else FAILED naming the missing ones."""

from __future__ import annotations

import pytest

from flashdraft.components.stream_end.stream_end import end_stream
from flashdraft.config import load_config
from flashdraft.features.window import WindowConsumer
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


def test_end_stream_fails_the_stream_for_missing_shards_then_ends_it(tmp_path):
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}", "mode.kind": "streaming",
                                                "data.num_shards": 3})
    store = open_store(cfg.storage, cfg.run_id)
    store.commit_json(layout.features_done_key(0), {"shard": 0})
    store.commit_json(layout.features_done_key(2), {"shard": 2})
    with pytest.raises(RuntimeError, match=r"shard\(s\) \[1\]"):
        end_stream(cfg)
    assert "[1]" in store.get_json(layout.STREAM_FAILED)["message"]
    with pytest.raises(Exception, match="producer failed"):
        WindowConsumer(store).check()

    store.delete(layout.STREAM_FAILED)
    store.commit_json(layout.features_done_key(1), {"shard": 1})
    assert end_stream(cfg).state == "EOS"
    assert store.exists(layout.STREAM_EOS) and WindowConsumer(store).check()
