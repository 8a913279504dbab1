"""`run_export(cfg)`: the final (else latest) training checkpoint -> serving formats, in the object store under
`export/<format>/` and in a local folder. Formats are described in zlab.py; every folder also holds its model card
(README.md, card.py).

A folder is served as is, so nothing but the format's files lives in it: the store's commit protocol for a folder
is one record beside it, `export/<format>.manifest.json` (committed; it lists every file with its sha256 and size).
The files are written first, then the manifest is committed; a changed export uncommits the old manifest before
any file changes, and `read_export` returns only files that match a committed manifest. A crash leaves files no
committed manifest vouches for, which the rerun overwrites."""

from __future__ import annotations

import io
import json
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as save_bytes

from flashdraft.components.export.card import CARD_FILE, render_card
from flashdraft.components.export.summary import ExportedFormat, ExportSummary
from flashdraft.config import RunConfig
from flashdraft.drafter.zlab import (
    MASK_PT,
    MASK_ST,
    draft_vocab_tensors,
    speculators_config,
    split_mask,
    zlab_config,
)
from flashdraft.run.provenance import current as current_provenance
from flashdraft.run.target_pin import recorded_pin
from flashdraft.storage import layout
from flashdraft.storage.exports import (
    ExportFile,
    ExportManifest,
    UnsafeNameError,
    read_export_file,
    read_manifest,
    safe_name,
)
from flashdraft.storage.store import ObjectStore, io_counters, open_store, sha256_hex

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ExportError(RuntimeError):
    """Nothing to export, or an unusable checkpoint; the message says which."""


def exported_formats(store: ObjectStore) -> list[str]:
    """The formats with a committed export folder; a listed name that is not one plain folder name (a key
    `export/...manifest.json` gives `..`) is refused (UnsafeNameError), never used as a local path."""
    out = []
    for key in store.list_committed(layout.EXPORT + "/"):
        fmt = layout.export_format_of(key)
        if fmt is not None:
            out.append(safe_name(fmt, store.url(key)))
    return sorted(out)


def commit_export(store: ObjectStore, fmt: str, files: dict[str, bytes]) -> ExportManifest:
    """Write `files` as `export/<fmt>/` (nothing else left in it), then commit the folder's manifest."""
    prefix, key = layout.export_prefix(fmt), layout.export_manifest_key(fmt)
    manifest = ExportManifest(format=fmt, files={n: ExportFile(sha256=sha256_hex(d), size=len(d))
                                                 for n, d in files.items()})
    if store.is_committed(key) and read_manifest(store, fmt) != manifest:
        store.uncommit(key)  # readers stop trusting the folder before any of its bytes change
    for name, data in files.items():
        store.put(prefix + name, data)
    for stale in store.list(prefix):  # files of an earlier export, and an older flashdraft's per-file .commit records
        if stale[len(prefix):] not in files:
            store.delete(stale)
    store.commit_json(key, manifest.model_dump(mode="json"))
    return manifest


def read_export(store: ObjectStore, fmt: str) -> dict[str, bytes]:
    """Every file of the committed `export/<fmt>/`, each checked against the manifest (re-read up to 3 times on a
    mismatch, as `ObjectStore.get_verified` does: corruption in flight differs on the next read); the manifest's
    file names are plain names (`safe_name`)."""
    manifest = read_manifest(store, fmt)
    if manifest is None:
        raise ExportError(f"{store.url(layout.export_manifest_key(fmt))} is not committed: no {fmt} export in this "
                          "run (run `flashdraft export`)")
    return {name: read_export_file(store, fmt, name, manifest) for name in manifest.files}


def write_folder(folder: str | Path, files: dict[str, bytes]) -> Path:
    """`folder` holding exactly `files`: written beside it, then swapped in, so a reader never sees a mix of two
    exports and files of an earlier export do not linger. Every file must land directly in it (checked before
    anything is written)."""
    folder = Path(folder).resolve()
    tmp = folder.parent / f".{folder.name}.tmp-{uuid.uuid4().hex[:8]}"
    for name in files:
        inside(tmp, name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    if folder.exists():
        old = folder.parent / f".{folder.name}.old-{uuid.uuid4().hex[:8]}"
        folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old)
    else:
        tmp.rename(folder)
    return folder


def inside(root: Path, name: str) -> Path:
    """`root / name`, refused (UnsafeNameError) unless it resolves to a path directly inside `root`: the last
    check on a name read from the store before it becomes a local path."""
    path = (root / name).resolve()
    if path.parent != root.resolve():
        raise UnsafeNameError(f"{name!r} would be written at {path}, outside {root.resolve()}: refused")
    return path


def download_export(store: ObjectStore, out_dir: str | Path) -> dict[str, Path]:
    """Every committed export format of the run into `out_dir/<format>/` (run-local's local copy), each folder
    then named as the format's `local` in the export's summary (metrics/export.json), so the record a script reads
    says where the copy is, as the console does. Every format and file name is checked, and every file read and
    verified, before anything local is touched: a refused name leaves `out_dir` as it was."""
    out = Path(out_dir).resolve()
    exports = {fmt: read_export(store, fmt) for fmt in exported_formats(store)}
    for fmt, files in exports.items():
        for name in files:
            inside(inside(out, fmt), name)
    folders = {fmt: write_folder(out / fmt, files) for fmt, files in exports.items()}
    key = layout.metrics_key("export")
    if folders and store.is_committed(key):
        summary = ExportSummary.model_validate(store.get_json_verified(key))
        formats = summary.formats or {}
        for fmt, folder in folders.items():
            formats.setdefault(fmt, ExportedFormat()).local = str(folder)
        store.commit_json(key, summary.model_copy(update={"formats": formats}).dump())
    return folders


def _files_zlab(drafter, dtype: str, mask_pt: bool = False) -> dict[str, bytes]:
    """The z-lab folder's files; a trained mask embedding in mask_embedding.safetensors, and with `mask_pt`
    (export.mask_embedding_pt) also in mask_embedding.pt, the pickle vLLM reads it from (never read back here)."""
    g = drafter.config_dict()
    body, mask = split_mask(drafter.weights())
    body = draft_vocab_tensors(body, drafter.head_weight)
    files = {"config.json": json.dumps(zlab_config(g, dtype), indent=2).encode(),
             "model.safetensors": save_bytes({k: (v.to(DTYPES[dtype]) if v.is_floating_point() else v).contiguous()
                                              for k, v in body.items()})}
    if mask is not None:
        m = mask.to(DTYPES[dtype]).contiguous()
        files[MASK_ST] = save_bytes({"mask_embedding": m})
        if mask_pt:
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


def _exported_drafter(cfg: RunConfig, store: ObjectStore) -> tuple[Any, dict[str, Any]]:
    """(the drafter to export, {prefix, step, final}): the latest training checkpoint, or in an evaluate-only run
    the pretrained drafter as is (re-exported in the run's formats and dtype; step 0)."""
    from flashdraft.drafter.persistence import build_drafter, load_drafter
    from flashdraft.storage.checkpoint import latest_checkpoint
    from flashdraft.target.model import resolve_target

    if cfg.evaluate_only:
        drafter = build_drafter(cfg, resolve_target(cfg).hf_config())
        return drafter, {"prefix": drafter.parent.source, "step": 0, "final": True}
    latest = latest_checkpoint(store)
    if latest is None:
        raise ExportError(f"no training checkpoint in {store.url(layout.CHECKPOINTS)}: run `flashdraft train` first")
    if not latest["final"]:
        log.warning("exporting %s: training has not finished (step %d)", latest["prefix"], latest["step"])
    return load_drafter(store, prefix=latest["prefix"], target=cfg.target), latest


def run_export(cfg: RunConfig, *, out_dir: str | Path | None = None) -> ExportSummary:
    """Export the trained drafter to the run's store (`export/<format>/`) and, when `out_dir` is given, to
    `out_dir/<format>/`, in the formats and dtype of `cfg.export` (so a pipeline run asks for them like any
    other setting; `flashdraft export --dtype/--speculators` override them)."""
    from flashdraft.target.model import resolve_target

    dtype = cfg.export.dtype
    io0 = io_counters()
    store = open_store(cfg.storage, cfg.run_id)
    drafter, latest = _exported_drafter(cfg, store)
    if drafter.geometry.trainable_mask:
        log.warning("the drafter's mask embedding is trained (no free row in the target vocabulary): vLLM reads it "
                    "from mask_embedding.pt (a pickle, %s), but the z-lab reference code and speculators' DFlash "
                    "converter embed mask slots with the target's row %d and draft differently; train with an "
                    "explicit drafter.mask_token_id (a token the chat never produces) for an export every reader "
                    "shares", "written: export.mask_embedding_pt=true" if cfg.export.mask_embedding_pt else
                    "not written: set export.mask_embedding_pt=true to serve this drafter with vLLM",
                    drafter.geometry.mask_token_id)
    if "speculators" in cfg.export.formats and drafter.geometry.is_dflash2:
        raise ExportError("export.formats: the speculators format is written for DFlash only; a dflash2 drafter "
                          "exports as z-lab DFlash2DraftModel (served by vLLM with method dflash)")
    formats = {}
    for name in cfg.export.formats:
        if name == "zlab":
            formats[name] = _files_zlab(drafter, dtype, cfg.export.mask_embedding_pt)
        else:
            archs = list(getattr(resolve_target(cfg).hf_config(), "architectures", None) or [])
            formats[name] = _files_speculators(drafter, dtype, archs)
    pin = recorded_pin(store)
    provenance = current_provenance(pin.sha, pin.digest) if pin else current_provenance()
    g = drafter.config_dict()
    for name, files in formats.items():
        files[CARD_FILE] = render_card(cfg, store, g, name, dtype, latest["step"], latest["final"], dict(files),
                                       provenance).encode()
    summary = ExportSummary(
        checkpoint=latest["prefix"], step=latest["step"], final=latest["final"], dtype=dtype,
        mask_token_id=drafter.geometry.mask_token_id, trainable_mask=drafter.geometry.trainable_mask,
        target_layer_ids=drafter.geometry.target_layer_ids, formats={}, provenance=provenance)
    for name, files in formats.items():
        folder = write_folder(Path(out_dir) / name, files) if out_dir is not None else None
        commit_export(store, name, files)
        summary.formats[name] = ExportedFormat(local=str(folder) if folder else None,
                                               store=store.url(layout.export_prefix(name)),
                                               manifest=store.url(layout.export_manifest_key(name)),
                                               bytes={f: len(d) for f, d in files.items()})
        log.info("exported %s to %s%s", name, store.url(layout.export_prefix(name)),
                 f" and {folder}" if folder else "")
    summary.store_io = io_counters(io0)
    return summary
