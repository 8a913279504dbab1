"""Stage runs for the kill loops in tests/integration/test_faults.py, started from a multiprocessing forkserver that
has torch, transformers and flashdraft already imported: a restart then costs a fork, not a 5-10 s interpreter
start, so ten real SIGKILLs fit in a test's budget. Each run leads its own process group, so one killpg takes
down the stage and any subprocess it started (the streaming producers)."""

from __future__ import annotations

import logging
import os

PRELOAD = ["torch", "transformers", "flashdraft.components.extract.extract", "flashdraft.components.train.trainer",
           "flashdraft.pipelines.runtime", "support.fault_workers"]


def run_stage(kind: str, config_json: str, env: dict[str, str]) -> None:
    """`extract`: every generation shard in order; `stream`: the streaming pair (producers + trainer)."""
    os.setsid()
    os.environ.update(env)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from flashdraft.config import RunConfig

    cfg = RunConfig.model_validate_json(config_json)
    if kind == "extract":
        from flashdraft.components.extract.extract import run_extract

        for shard in range(cfg.data.num_shards):
            run_extract(cfg, shard)
    elif kind == "stream":
        from flashdraft.pipelines.runtime import train_with_producers

        train_with_producers(cfg)
    else:
        raise ValueError(kind)
