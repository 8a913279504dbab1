"""What a target's weights are, without the run's store: the commit a Hub revision names, the files of a folder or
a commit, the safetensors-only rule, and the digest of the weight files that provenance, the report and the model
card record. flashdraft/run/target_pin.py records these once per run and fetches the pinned snapshot.

Why a digest besides the commit: a commit says which weights were asked for; the digest (sha256 over the
safetensors files' names and sha256s) says which bytes were loaded, and is the only identity a local folder has.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from flashdraft.config import ConfigError, TargetConfig

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
WEIGHT_SUFFIX = ".safetensors"
# Weights in a pickle-based format (or a format flashdraft does not load): never fetched, never loaded.
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle", "*.msgpack", "*.h5", "*.gguf", "*.onnx")
HASH_BLOCK = 8 << 20


class PickleOnlyTargetError(ConfigError):
    """The target's folder or commit has no safetensors weights (only pytorch_model.bin or none at all)."""


def is_commit(revision: str | None) -> bool:
    """A full 40-hex commit sha (what a pinned revision must be)."""
    return bool(revision and COMMIT_RE.match(revision))


def hub_commit(model: str, revision: str | None) -> tuple[str, dict[str, int]]:
    """(commit sha, file name -> bytes) of `revision` of the Hub model `model` (None: "main"). Always asks with a
    revision: a Hub mirror (olah) answers `/api/models/<id>/revision/<rev>` where it may not answer the bare id."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(model, revision=revision or "main", files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - the Hub's many error types: one line naming the setting
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"target.model={model} target.revision={revision or 'main'}: cannot resolve it to a "
                          f"commit ({first}); check the id, the revision, HF_ENDPOINT and HF_TOKEN") from exc
    return str(info.sha), {s.rfilename: int(s.size or 0) for s in (info.siblings or [])}


def check_safetensors(names: list[str], where: str) -> None:
    """Refuse, in one line and before any load, a target whose files hold no safetensors weights."""
    if any(n.endswith(WEIGHT_SUFFIX) for n in names):
        return
    pickles = sorted(n for n in names if Path(n).suffix in {p[1:] for p in PICKLE_WEIGHTS})
    found = f"only {', '.join(pickles[:3])}" if pickles else "no weight files"
    raise PickleOnlyTargetError(f"target {where}: {found}; flashdraft loads safetensors weights only (no pickle): "
                                "pick a revision or folder with model.safetensors, or convert the weights")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def weights_digest(hashes: dict[str, str]) -> str:
    """sha256 over the sorted `name sha256` lines of the safetensors files (`hashes`: file name -> sha256)."""
    lines = "".join(f"{n} {h}\n" for n, h in sorted(hashes.items()) if n.endswith(WEIGHT_SUFFIX))
    return hashlib.sha256(lines.encode()).hexdigest()


def folder_files(folder: Path) -> list[str]:
    """Relative names of the files under `folder` (a snapshot's, less the Hub client's own `.cache`)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and ".cache" not in p.relative_to(folder).parts)


def folder_hashes(folder: Path) -> dict[str, str]:
    """sha256 of each safetensors file of `folder`, refusing a folder without any (`check_safetensors`)."""
    names = folder_files(folder)
    check_safetensors(names, str(folder))
    return {n: file_sha256(folder / n) for n in names if n.endswith(WEIGHT_SUFFIX)}


def local_folder(target: TargetConfig) -> Path | None:
    """The folder a `source: hf` target names when target.model is a path on this machine (None: a Hub id)."""
    path = Path(target.model).expanduser()
    return path if target.source == "hf" and path.is_dir() else None
