"""`run_export(cfg)`: the final (else latest) training checkpoint -> serving formats, in the object store under
`export/<format>/` (committed) and in a local folder. Formats are described in zlab.py."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import torch
from safetensors.torch import save as save_bytes

from flashdraft import layout
from flashdraft.config import RunConfig
from flashdraft.store import io_counters, open_store
from flashdraft.summaries import ExportSummary
from flashdraft.zlab import (
    MASK_PT,
    MASK_ST,
    draft_vocab_tensors,
    speculators_config,
    split_mask,
    zlab_config,
)

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ExportError(RuntimeError):
    """Nothing to export, or an unusable checkpoint; the message says which."""


def _files_zlab(drafter, dtype: str) -> dict[str, bytes]:
    g = drafter.config_dict()
    body, mask = split_mask(drafter.weights())
    body = draft_vocab_tensors(body, drafter.head_weight)
    files = {"config.json": json.dumps(zlab_config(g, dtype), indent=2).encode(),
             "model.safetensors": save_bytes({k: (v.to(DTYPES[dtype]) if v.is_floating_point() else v).contiguous()
                                              for k, v in body.items()})}
    if mask is not None:
        m = mask.to(DTYPES[dtype]).contiguous()
        files[MASK_ST] = save_bytes({"mask_embedding": m})
        buf = io.BytesIO()
        torch.save(m, buf)  # vLLM's optional mask override is a torch file; we never read it back
        files[MASK_PT] = buf.getvalue()
    return files


def _files_speculators(drafter, dtype: str, verifier_architectures: list[str]) -> dict[str, bytes]:
    g = drafter.config_dict()
    body, mask = split_mask(drafter.weights())
    tensors = draft_vocab_tensors({**body, "embed_tokens.weight": drafter.embed_weight,
                                   "lm_head.weight": drafter.lm_head_weight}, drafter.head_weight)
    if mask is not None:
        tensors["mask_embedding"] = mask
    cfg = speculators_config(g, dtype, verifier_architectures)
    return {"config.json": json.dumps(cfg, indent=2).encode(),
            "model.safetensors": save_bytes({k: (v.detach().to(DTYPES[dtype]) if v.is_floating_point() else v)
                                             .contiguous() for k, v in tensors.items()})}


def run_export(cfg: RunConfig, *, out_dir: str | Path | None = None) -> ExportSummary:
    """Export the trained drafter to the run's store (`export/<format>/`) and, when `out_dir` is given, to
    `out_dir/<format>/`, in the formats and dtype of `cfg.export` (so a pipeline run asks for them like any
    other setting; `flashdraft export --dtype/--speculators` override them)."""
    from flashdraft.checkpoint import latest_checkpoint
    from flashdraft.drafter.model import DFlashDrafter
    from flashdraft.target import load_hf_config

    dtype = cfg.export.dtype
    io0 = io_counters()
    store = open_store(cfg.storage, cfg.run_id)
    latest = latest_checkpoint(store)
    if latest is None:
        raise ExportError(f"no training checkpoint in {store.url(layout.CHECKPOINTS)}: run `flashdraft train` first")
    if not latest["final"]:
        log.warning("exporting %s: training has not finished (step %d)", latest["prefix"], latest["step"])
    drafter = DFlashDrafter.from_pretrained(store, prefix=latest["prefix"], target=cfg.target)
    if drafter.geometry.trainable_mask:
        log.warning("the drafter's mask embedding is trained (no free row in the target vocabulary): vLLM reads it "
                    "from mask_embedding.pt, but the z-lab reference code and speculators' DFlash converter embed "
                    "mask slots with the target's row %d and draft differently; train with an explicit "
                    "drafter.mask_token_id (a token the chat never produces) for an export every reader shares",
                    drafter.geometry.mask_token_id)
    if "speculators" in cfg.export.formats and drafter.geometry.is_dflash2:
        raise ExportError("export.formats: the speculators format is written for DFlash only; a dflash2 drafter "
                          "exports as z-lab DFlash2DraftModel (served by vLLM with method dflash)")
    formats = {}
    for name in cfg.export.formats:
        if name == "zlab":
            formats[name] = _files_zlab(drafter, dtype)
        else:
            archs = list(getattr(load_hf_config(cfg.target), "architectures", None) or [])
            formats[name] = _files_speculators(drafter, dtype, archs)
    summary = {"checkpoint": latest["prefix"], "step": latest["step"], "final": latest["final"], "dtype": dtype,
               "mask_token_id": drafter.geometry.mask_token_id, "trainable_mask": drafter.geometry.trainable_mask,
               "target_layer_ids": drafter.geometry.target_layer_ids, "formats": {}}
    for name, files in formats.items():
        folder = Path(out_dir) / name if out_dir is not None else None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        for fname, data in files.items():
            if folder is not None:
                (folder / fname).write_bytes(data)
            store.commit(layout.export_prefix(name) + fname, data)
        summary["formats"][name] = {"local": str(folder.resolve()) if folder else None,
                                    "store": store.url(layout.export_prefix(name)),
                                    "bytes": {f: len(d) for f, d in files.items()}}
        log.info("exported %s to %s%s", name, store.url(layout.export_prefix(name)),
                 f" and {folder}" if folder else "")
    summary["store_io"] = io_counters(io0)
    return ExportSummary.model_validate(summary)
