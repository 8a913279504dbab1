"""One pinned target per run, fetched once (docs/configuration.md "Target revision", docs/cluster.md "Model cache").

* Pin: the first task of a run that meets the target (the plan gate on a cluster and in run-local) resolves
  `target.revision` (a branch, a tag or None = "main") to a 40-hex commit and commits `target/pin.json`; a local
  folder or a target flashdraft builds (tiny, random, smollm2-pypi) is pinned by the digest of its safetensors
  files instead. The plan gate runs on every start and resume and asks again; any later task whose
  `target.revision` differs from the pinned request asks again too. An answer other than the pin (the branch
  moved, the user named another commit, the folder changed) is refused in one line naming both.
* Fetch: a task that loads a Hub target reads the pinned commit's snapshot from the run's store
  (`target/<sha>/files/...`, listed with each file's sha256 in the committed `target/<sha>/manifest.json`) into
  its local cache, verifying every file; the first such task (prep, on the CPU pool, before any GPU task) downloads
  it from the Hub with huggingface_hub's `snapshot_download` (safetensors, config and tokenizer files; never
  pickle weights) and stores it. `pinned_target` then points every loader of this process and its children
  (torchrun ranks, vLLM workers) at that folder through `TARGET_DIR_ENV`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field

from flashdraft.config import ConfigError, RunConfig, TargetConfig
from flashdraft.storage.store import ObjectStore
from flashdraft.target.model import (
    TARGET_DIR_ENV,
    TARGET_ID_ENV,
    TargetNotFoundError,
    cache_dir,
    resolve_model_dir,
)
from flashdraft.target.snapshot import (
    PICKLE_WEIGHTS,
    check_safetensors,
    file_sha256,
    folder_files,
    folder_hashes,
    hub_commit,
    local_folder,
    weights_digest,
)

PIN_KEY = "target/pin.json"


def snapshot_prefix(sha: str) -> str:
    return f"target/{sha}"


class TargetPin(BaseModel):
    """The weights a run loads: `target/pin.json`."""

    model: str = Field(description="target.model as pinned")
    revision: str | None = Field(None, description="target.revision as the user wrote it when pinned")
    sha: str | None = Field(None, description="the 40-hex Hub commit every stage loads; None for a local folder or "
                                              "a built target")
    digest: str | None = Field(None, description="sha256 over the safetensors files' names and sha256s; for a Hub "
                                                 "target set once its snapshot is fetched")
    files: dict[str, int] = Field(default_factory=dict, description="file name -> bytes of the pinned snapshot")

    @property
    def weight_bytes(self) -> int:
        return sum(n for f, n in self.files.items() if f.endswith(".safetensors"))

    def line(self) -> str:
        """`Qwen/Qwen3.6-27B at commit 0123456789ab, weights sha256 89abcdef0123`: one line for a page."""
        at = f"commit {self.sha}" if self.sha else "a local folder"
        return f"{self.model} at {at}, weights sha256 {self.digest or 'not fetched yet'}"


class TargetMovedError(ConfigError):
    """A task would load other weights than the ones its run pinned."""


def read_pin(store: ObjectStore) -> TargetPin | None:
    if not store.is_committed(PIN_KEY):
        return None
    return TargetPin.model_validate(store.get_json_verified(PIN_KEY))


def resolve_pin(target: TargetConfig) -> TargetPin:
    """What `target` names right now: a Hub commit (one metadata request) or a folder's weight digest."""
    folder = local_folder(target)
    if target.source == "hf" and folder is None and target.model.startswith(("/", "./", "../", "~")):
        raise TargetNotFoundError(f"target.model={target.model}: no such folder; set target.model to a local model "
                                  "folder or a Hub id (namespace/name)")
    if target.source == "hf" and folder is None:
        sha, sizes = hub_commit(target.model, target.revision)
        check_safetensors(list(sizes), f"{target.model} at commit {sha}")
        return TargetPin(model=target.model, revision=target.revision, sha=sha, files=sizes)
    built = Path(resolve_model_dir(target))
    hashes = folder_hashes(built)
    sizes = {n: (built / n).stat().st_size for n in folder_files(built)}
    return TargetPin(model=target.model, revision=target.revision, digest=weights_digest(hashes), files=sizes)


def _asks_same(pin: TargetPin, target: TargetConfig) -> bool:
    """The config asks for what the pin recorded (the same revision text, or the pinned commit itself)."""
    return pin.model == target.model and target.revision in (pin.revision, pin.sha)


def _refusal(pin: TargetPin, now: TargetPin, target: TargetConfig) -> TargetMovedError:
    if pin.sha or now.sha:
        asked = f"target.revision={target.revision or 'main'}"
        return TargetMovedError(
            f"target {target.model}: this run pinned commit {pin.sha} ({PIN_KEY}) but {asked} now resolves to "
            f"{now.sha}: set target.revision={pin.sha} to go on with the pinned weights, or start a new run_id")
    return TargetMovedError(
        f"target {target.model}: this run pinned weights sha256 {pin.digest} ({PIN_KEY}) but its files now hash to "
        f"{now.digest}: restore the folder's files, or start a new run_id")


def pin_target(cfg: RunConfig, store: ObjectStore, *, recheck: bool = False) -> TargetPin:
    """The run's pin, committed by the first caller; `recheck` (the plan gate) resolves again even when the
    config asks for what was pinned. A different answer is refused (`TargetMovedError`)."""
    pin = read_pin(store)
    if pin is not None and not recheck and _asks_same(pin, cfg.target):
        return pin
    now = resolve_pin(cfg.target)
    if pin is None:
        store.commit_json(PIN_KEY, now.model_dump())
        return now
    same = pin.sha == now.sha if (pin.sha or now.sha) else pin.digest == now.digest
    if not same or pin.model != now.model:
        raise _refusal(pin, now, cfg.target)
    return pin


# -- the snapshot, fetched once ---------------------------------------------------------------------------


def _manifest_key(sha: str) -> str:
    return f"{snapshot_prefix(sha)}/manifest.json"


def _file_key(sha: str, name: str) -> str:
    return f"{snapshot_prefix(sha)}/files/{name}"


def _download_from_hub(pin: TargetPin, into: Path) -> None:
    from huggingface_hub import snapshot_download

    snapshot_download(pin.model, revision=pin.sha, local_dir=str(into), ignore_patterns=list(PICKLE_WEIGHTS))


def _store_snapshot(store: ObjectStore, pin: TargetPin, folder: Path) -> dict[str, dict]:
    """Upload every file of `folder` (streamed, not held in memory), then commit the manifest that lists them."""
    files = {}
    for name in folder_files(folder):
        store.fs.put_file(str(folder / name), store.url(_file_key(pin.sha, name)))
        files[name] = {"sha256": file_sha256(folder / name), "size": (folder / name).stat().st_size}
    digest = weights_digest({n: f["sha256"] for n, f in files.items()})
    store.commit_json(_manifest_key(pin.sha), {"model": pin.model, "sha": pin.sha, "digest": digest,
                                               "files": files})
    return files


def _load_snapshot(store: ObjectStore, sha: str, files: dict[str, dict], into: Path) -> None:
    """Copy the stored snapshot into `into`, refusing a file whose sha256 is not the manifest's."""
    for name, meta in files.items():
        dest = into / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        store.fs.get_file(store.url(_file_key(sha, name)), str(dest))
        got = file_sha256(dest)
        if got != meta["sha256"]:
            raise ConfigError(f"{store.url(_file_key(sha, name))}: sha256 {got[:12]}… is not the manifest's "
                              f"{meta['sha256'][:12]}… (a corrupted copy of the pinned target; delete it and rerun)")


def fetch_snapshot(store: ObjectStore, pin: TargetPin) -> Path:
    """The pinned commit's files in this machine's cache (`$FLASHDRAFT_CACHE/targets/<sha>`), from the run's store,
    or from the Hub once when the store has none yet (then the pin gains its digest)."""
    local = cache_dir() / "targets" / str(pin.sha)
    marker = local / ".flashdraft-verified.json"
    if marker.is_file():
        return local
    tmp = local.with_name(f"{local.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if store.is_committed(_manifest_key(pin.sha)):
        manifest = store.get_json_verified(_manifest_key(pin.sha))
        _load_snapshot(store, pin.sha, manifest["files"], tmp)
    else:
        _download_from_hub(pin, tmp)
        check_safetensors(folder_files(tmp), f"{pin.model} at commit {pin.sha}")
        manifest = {"files": _store_snapshot(store, pin, tmp)}
        manifest["digest"] = weights_digest({n: f["sha256"] for n, f in manifest["files"].items()})
        store.commit_json(PIN_KEY, pin.model_copy(update={"digest": manifest["digest"]}).model_dump())
    shutil.rmtree(tmp / ".cache", ignore_errors=True)
    (tmp / marker.name).write_text(json.dumps({"sha": pin.sha, "digest": manifest["digest"]}))
    try:
        tmp.rename(local)
    except OSError:  # another process of this machine finished first: its copy holds the same verified bytes
        shutil.rmtree(tmp, ignore_errors=True)
    return local


@contextlib.contextmanager
def pinned_target(cfg: RunConfig, store: ObjectStore, *, recheck: bool = False, fetch: bool = False
                  ) -> Iterator[TargetPin]:
    """Pin (or check) the run's target and make every loader of this process and its children ask for the pinned
    commit while the block runs; with `fetch`, load it from the snapshot's local copy (a Hub target)."""
    pin = pin_target(cfg, store, recheck=recheck)
    if not pin.sha:
        yield pin
        return
    env = {TARGET_ID_ENV: f"{pin.model}@{pin.sha}"}
    if fetch:
        env[TARGET_DIR_ENV] = str(fetch_snapshot(store, pin))
        pin = read_pin(store) or pin
    saved = {k: os.environ.get(k) for k in (TARGET_DIR_ENV, TARGET_ID_ENV)}
    os.environ.pop(TARGET_DIR_ENV, None)
    os.environ.update(env)
    try:
        yield pin
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def recorded_pin(store: ObjectStore) -> TargetPin | None:
    """The pin a finished run recorded, for provenance, the report and the card (None: a run from before pins)."""
    try:
        return read_pin(store)
    except (ConfigError, ValueError, OSError):
        return None

