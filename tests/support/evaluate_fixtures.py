"""Test helper shared by the evaluate and report tests: a drafter checkpoint committed the way the trainer
commits one (files, then checkpoints/latest.json), so `run_evaluate` can run without a training run."""

from __future__ import annotations

import tempfile
from pathlib import Path

from flashdraft.storage import layout
from flashdraft.storage.store import open_store


def commit_drafter(cfg, seed: int, step: int = 1) -> str:
    """A randomly initialised drafter saved under checkpoints/step-<step>/ of the run; returns its URI."""
    from flashdraft.drafter.persistence import build_drafter, save_drafter
    from flashdraft.target.model import load_hf_config

    store = open_store(cfg.storage, cfg.run_id)
    prefix = layout.checkpoint_prefix(step)
    with tempfile.TemporaryDirectory() as tmp:
        save_drafter(build_drafter(cfg, load_hf_config(cfg.target), seed=seed), tmp)
        for f in sorted(Path(tmp).iterdir()):
            store.commit(f"{prefix}/{f.name}", f.read_bytes())
    store.commit_json(layout.CHECKPOINT_LATEST, {"step": step, "prefix": prefix, "final": True})
    return store.url(prefix)
