"""The stream-end task: after the streaming extract loop, tell the trainer the stream ended (EOS) or failed."""

from __future__ import annotations

from flashdraft.components.stream_end.summary import StreamEndSummary
from flashdraft.config import RunConfig
from flashdraft.features.window import WindowProducer
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


def end_stream(cfg: RunConfig) -> StreamEndSummary:
    """After the streaming extract loop: EOS when every shard is extracted, else FAILED naming the missing ones.

    Runs even when extract tasks failed (after their retries), so the trainer never waits for a dead producer.
    """
    store = open_store(cfg.storage, cfg.run_id)
    producer = WindowProducer(store, cfg.mode)
    missing = [s for s in range(cfg.data.num_shards) if not store.is_committed(layout.features_done_key(s))]
    if missing:
        producer.fail(f"extraction did not complete shard(s) {missing}")
        raise RuntimeError(f"streaming: extraction did not complete shard(s) {missing}; the trainer was told")
    producer.finish()
    return StreamEndSummary(shards=cfg.data.num_shards, state="EOS")
