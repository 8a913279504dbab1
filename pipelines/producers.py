"""Streaming extraction producers for a local run: `python -m flashdraft.pipelines.producers CONFIG.yaml`.

kfp.local runs sibling tasks one after another, so the local train task starts this in a background process: it
extracts every shard in order through `run_extract` (which waits whenever the bounded window is full), then ends
the stream. Any failure becomes the window's FAILED marker, so the trainer stops with the cause instead of waiting.
"""

from __future__ import annotations

import logging
import sys

from flashdraft.components.stream_end.stream_end import end_stream
from flashdraft.config import load_config


def main(config_path: str) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s producers: %(message)s")
    cfg = load_config(config_path)
    from flashdraft.features.window import WindowProducer
    from flashdraft.run.runner import run_task
    from flashdraft.storage.store import open_store

    try:
        for shard in range(cfg.data.num_shards):  # each shard recorded like a cluster extract task
            run_task(cfg, "extract", shard)
    except BaseException as exc:
        WindowProducer(open_store(cfg.storage, cfg.run_id), cfg.mode).fail(
            f"extraction producer: {type(exc).__name__}: {exc}")
        logging.exception("extraction producer failed")
        return 1
    end_stream(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
