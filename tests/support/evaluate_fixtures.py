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


def export_perturbed_drafter(cfg, out_dir: Path, seed: int = 5, step: int = 1):
    """A seeded drafter with perturbed norms (so a loader that drops or re-initialises one is caught), committed as
    the run's final checkpoint and exported by `run_export` to the store and `out_dir`; returns it in eval mode."""
    import torch

    from flashdraft.components.export.export import run_export
    from flashdraft.drafter.persistence import build_drafter
    from flashdraft.storage.checkpoint import save_checkpoint
    from flashdraft.target.model import load_hf_config

    model = build_drafter(cfg, load_hf_config(cfg.target), seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    save_checkpoint(open_store(cfg.storage, cfg.run_id), model, torch.optim.AdamW(model.parameters()),
                    model.config_dict(), {"step": step, "history": []}, final=True)
    run_export(cfg, out_dir=out_dir)
    return model.eval()
