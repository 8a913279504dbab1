"""`drafter.init: pretrained`: a published or earlier drafter as a run's starting point (or, with
`training.max_steps: 0`, as the drafter a run evaluates).

`drafter.init_from` names where it lives: a local folder, `hf:<repo>[@revision]` (read through the Hugging Face
cache: `HF_HUB_OFFLINE=1` reads only what is cached), or a store URI (`file://`, `s3://`: a run's `export/<format>/`,
its `checkpoints/` whose latest.json names the newest, or one `checkpoints/step-N/`). Three formats, told apart by
their files: flashdraft's own drafter folder (`drafter_config.json`), z-lab's (`config.json` with architectures
DFlashDraftModel / DFlash2DraftModel) and speculators' (`config.json` with speculators_model_type dflash).

The geometry is the checkpoint's. `parent_geometry` checks it against the run's settings and its target: a drafter
setting left unset (None) takes the checkpoint's value, a set one must agree (one line naming the field and the
checkpoint's value), and a checkpoint made for another target (width, vocabulary, layer ids beyond the target's
layers) is refused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_bytes

from flashdraft.config.errors import ConfigError
from flashdraft.drafter.identity import ParentIdentity
from flashdraft.drafter.zlab import MASK_ST
from flashdraft.storage.exports import read_export_file, read_manifest
from flashdraft.storage.layout import EXPORT

ZLAB_CONFIG = "config.json"
# Drafter settings with no default (None: follow the checkpoint) and where the checkpoint states them.
FOLLOWED = ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "mask_token_id",
            "draft_vocab_size", "layer_types", "sliding_window")
# Settings with a default: they must equal the checkpoint's (train, plan and evaluate read them from the config).
REQUIRED = ("num_layers", "block_size")
DFLASH2_ONLY = ("candidate_selector.", "_conv.")


@dataclass(frozen=True)
class Parent:
    """A pretrained drafter as read: its geometry fields (DrafterGeometry's, `num_target_layers` None where the
    format does not record it), its trainable weights by our names, and its identity."""

    geometry: dict[str, Any]
    weights: dict[str, torch.Tensor]
    identity: ParentIdentity


Reader = Callable[[str], bytes | None]


def _hf_reader(spec: str) -> tuple[Reader, str, Callable[[], str | None]]:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    repo, _, revision = spec.partition("@")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise ConfigError(f"drafter.init_from={spec!r}: hf:<owner>/<repo>[@revision] expected")
    resolved: dict[str, str] = {}

    def read(name: str) -> bytes | None:
        try:
            path = Path(hf_hub_download(repo, name, revision=revision or None))
        except EntryNotFoundError:  # not in the repo, or offline and not cached
            return None
        except Exception as exc:  # noqa: BLE001 (no such repo or revision, no network): one line
            raise ConfigError(f"drafter.init_from=hf:{spec}: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        if path.parent.parent.name == "snapshots":
            resolved["commit"] = path.parent.name
        return path.read_bytes()

    return read, f"hf:{spec}", lambda: resolved.get("commit")


def _source_store(uri: str, storage):
    """The store folder `uri` names; a run's checkpoints/ resolves to its newest checkpoint (latest.json)."""
    from flashdraft.storage.layout import CONFIG_FILE
    from flashdraft.storage.store import ObjectStore

    store = ObjectStore(uri.rstrip("/"), storage)
    if not store.exists(CONFIG_FILE) and not store.exists(ZLAB_CONFIG) and store.exists("latest.json"):
        latest = store.get_json_verified("latest.json")  # its commit record: a torn write is refused
        store = store.child(latest["prefix"].rstrip("/").rsplit("/", 1)[-1])
    return store


def _store_reader(uri: str, storage) -> Reader:
    """Verified reads of the drafter at store `uri`: committed files against their commit records (a checkpoint),
    the files of a run's `export/<format>/` against the manifest beside it. Bytes nothing vouches for are refused:
    a byte flipped at rest must stop the run (ChecksumError naming the key), not start it from another drafter."""
    store = _source_store(uri, storage)
    exported = _export_manifest(store)

    def read(name: str) -> bytes | None:
        if store.is_committed(name):
            return store.get_verified(name)
        if exported is not None and name in exported[2].files:
            run, fmt, manifest = exported
            return read_export_file(run, fmt, name, manifest)
        if store.exists(name):
            raise ConfigError(f"drafter.init_from={uri}: {store.url(name)} has no commit record and no export "
                              "manifest lists it, so its bytes cannot be verified: name a run's checkpoints/ or "
                              "export/<format>/, or copy the folder out of the store and name the local folder")
        return None

    return read


def _export_manifest(store):
    """(the run's store, format, manifest) when `store` is a run's `export/<format>/` with a committed manifest."""
    parent, _, fmt = store.root.rstrip("/").rpartition("/")
    run, _, folder = parent.rpartition("/")
    if folder != EXPORT or not run:
        return None
    run_store = store.at(run, read_only=True)
    manifest = read_manifest(run_store, fmt)
    return None if manifest is None else (run_store, fmt, manifest)


def weights_digest(init_from: str, storage=None) -> str:
    """The sha256 of the pretrained drafter's model.safetensors, as cheaply as its place allows (the runner's
    fingerprint: a changed parent refuses or reruns like any changed setting): a store's commit record, a Hub
    cache blob's name (huggingface_hub names LFS blobs by their sha256), else the file hashed. A Hub file not in
    the cache is named by `init_from` itself (pin a commit with @revision to make that an identity); a missing
    file reads "missing" (loading it fails with its own error)."""
    from flashdraft.storage.layout import WEIGHTS_FILE

    if init_from.startswith("hf:"):
        from huggingface_hub import try_to_load_from_cache

        repo, _, revision = init_from.removeprefix("hf:").partition("@")
        found = try_to_load_from_cache(repo, WEIGHTS_FILE, revision=revision or None)
        if not isinstance(found, str):
            return init_from
        blob = Path(found).resolve()
        return blob.name if re.fullmatch(r"[0-9a-f]{64}", blob.name) else _file_sha256(blob)
    if "://" in init_from:
        store = _source_store(init_from, storage)
        record = store.read_commit(WEIGHTS_FILE)
        if record is not None:
            return record.sha256
        exported = _export_manifest(store)
        listed = exported[2].files.get(WEIGHTS_FILE) if exported is not None else None
        return listed.sha256 if listed is not None else "missing"
    path = Path(init_from).expanduser() / WEIGHTS_FILE
    return _file_sha256(path) if path.is_file() else "missing"


def _file_sha256(path: Path) -> str:
    stat = path.stat()  # a file rewritten in place gets a new mtime: hashed again
    return _hashed(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _hashed(path: str, mtime_ns: int, size: int) -> str:
    """A file's sha256, once per version of it in this process (the runner asks for every task it checks)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _folder_reader(folder: Path) -> Reader:
    if not folder.is_dir():
        raise ConfigError(f"drafter.init_from={str(folder)!r}: no such folder (a folder, hf:<repo>[@revision] or a "
                          "store URI)")

    def read(name: str) -> bytes | None:
        path = folder / name
        return path.read_bytes() if path.is_file() else None

    return read


def read_parent(init_from: str, storage=None, *, num_target_layers: int | None = None) -> Parent:
    """Read the drafter `init_from` names (module docstring). `num_target_layers`: the target's layer count, for
    the speculators format (which does not record it)."""
    from flashdraft.drafter.zlab import speculators_geometry, zlab_geometry
    from flashdraft.storage.layout import CONFIG_FILE, WEIGHTS_FILE

    revision: Callable[[], str | None] = lambda: None  # noqa: E731
    if init_from.startswith("hf:"):
        read, where, revision = _hf_reader(init_from.removeprefix("hf:"))
    elif "://" in init_from:
        read, where = _store_reader(init_from, storage), init_from
    else:
        read, where = _folder_reader(Path(init_from).expanduser()), init_from
    own, config = read(CONFIG_FILE), read(ZLAB_CONFIG)
    if own is None and config is None:
        offline = " (offline: is it in the Hugging Face cache?)" if where.startswith("hf:") else ""
        raise ConfigError(f"drafter.init_from={where}: neither {CONFIG_FILE} (a flashdraft drafter or checkpoint) "
                          f"nor {ZLAB_CONFIG} (z-lab or speculators) is there{offline}")
    raw = read(WEIGHTS_FILE)
    if raw is None:
        raise ConfigError(f"drafter.init_from={where}: no {WEIGHTS_FILE}")
    weights = load_bytes(raw)
    try:
        if own is not None:
            fmt, geometry = "flashdraft", json.loads(own)
        else:
            c = json.loads(config)
            if "speculators_model_type" in c:
                fmt = "speculators"
                geometry, weights = speculators_geometry(c, weights, f"{where}/{ZLAB_CONFIG}",
                                                         num_target_layers=num_target_layers)
            else:
                mask = read(MASK_ST)
                fmt = "zlab"
                geometry, weights = zlab_geometry(c, weights, load_bytes(mask)["mask_embedding"] if mask else None,
                                                  f"{where}/{ZLAB_CONFIG}")
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"drafter.init_from={where}: not a DFlash drafter checkpoint ({exc})") from None
    identity = ParentIdentity(source=where, format=fmt, revision=revision(), sha256=hashlib.sha256(raw).hexdigest())
    return Parent(geometry, weights, identity)


def _refuse(field: str, setting: Any, value: Any, source: str, how: str = "") -> ConfigError:
    return ConfigError(f"{field}={json.dumps(setting)} contradicts the pretrained drafter {source}, whose value is "
                       f"{json.dumps(value)}: {how or f'set {field}: {json.dumps(value)} or unset it'}")


def parent_geometry(cfg, parent: Parent, target_layers: int, target_hidden: int, target_vocab: int):
    """The DrafterGeometry a run starts from: the checkpoint's, checked against the run's drafter settings and its
    target, with the target recorded as the run's. A DFlash checkpoint starting a dflash2 run gets the run's
    DFlash2 fields (its DFlash2-only weights are initialised, `build_pretrained`)."""
    from flashdraft.drafter.geometry import DFLASH2_FIELDS, DrafterGeometry

    g, d, src = dict(parent.geometry), cfg.drafter, parent.identity.source
    if g.get("num_target_layers") is None:
        g["num_target_layers"] = target_layers
    for what, ours, theirs in (("hidden size", target_hidden, g["hidden_size"]),
                               ("vocabulary", target_vocab, g["vocab_size"]),
                               ("decoder layers", target_layers, g["num_target_layers"])):
        if ours != theirs:
            raise ConfigError(f"drafter.init_from={src} was made for another target: its {what} is {theirs}, "
                              f"{cfg.target.model}'s is {ours}")
    if max(g["target_layer_ids"]) >= target_layers:
        raise ConfigError(f"drafter.init_from={src} was made for another target: its target_layer_ids "
                          f"{g['target_layer_ids']} go beyond {cfg.target.model}'s {target_layers} layers")
    for field in REQUIRED:
        if getattr(d, field) != g[field]:
            raise _refuse(f"drafter.{field}", getattr(d, field), g[field], src, f"set drafter.{field}: {g[field]}")
    for field in FOLLOWED:
        theirs = g.get(field) if field != "layer_types" else g.get("layer_types") or ["full_attention"] * g[
            "num_layers"]
        mine = getattr(d, field) if field != "layer_types" else d.layer_types
        if mine is not None and mine != theirs:
            raise _refuse(f"drafter.{field}", mine, theirs, src)
    ids = cfg.layer_ids(target_layers)
    if ids != list(g["target_layer_ids"]):
        raise _refuse("features.layer_ids", ids, g["target_layer_ids"], src,
                      f"set features.layer_ids: {json.dumps(g['target_layer_ids'])} and features.num_features: "
                      f"{len(g['target_layer_ids'])} (the target layers it reads)")
    kind = g.get("kind", "dflash")
    if kind == "dflash2" and d.kind == "dflash":
        raise _refuse("drafter.kind", "dflash", "dflash2", src, "set drafter.kind: dflash2 (a DFlash2 drafter "
                      "cannot drop its convolutions and selector)")
    if kind == "dflash2":
        for field in DFLASH2_FIELDS:
            if getattr(d, field) != g[field]:
                raise _refuse(f"drafter.{field}", getattr(d, field), g[field], src,
                              f"set drafter.{field}: {g[field]}")
    elif d.kind == "dflash2":
        g.update(kind="dflash2", **{f: getattr(d, f) for f in DFLASH2_FIELDS})
    g["target"] = cfg.target.model_dump(mode="json")
    try:
        return DrafterGeometry(**g)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"drafter.init_from={src}: {exc}") from None


def build_pretrained(cfg, target_hf_config, *, seed: int, attn_impl: str = "auto",
                     frozen: tuple[torch.Tensor, torch.Tensor]):
    """The run's drafter started from `cfg.drafter.init_from`, with the frozen embedding / LM head `frozen`.
    Returns (drafter, parent identity, the DFlash2-only weight names that were initialised instead of loaded)."""
    from flashdraft.drafter.dflash_drafter import DFlashDrafter
    from flashdraft.target.model import text_config

    t = text_config(target_hf_config)
    layers = int(t.num_hidden_layers)
    parent = read_parent(cfg.drafter.init_from, cfg.storage, num_target_layers=layers)
    geometry = parent_geometry(cfg, parent, layers, int(t.hidden_size), int(t.vocab_size))
    model = DFlashDrafter(geometry, attn_impl=attn_impl)
    model.set_frozen(*frozen)
    model.init_weights(seed, cfg.drafter.mask_init)
    weights = {k: v.float() if v.is_floating_point() else v for k, v in parent.weights.items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    fresh = [k for k in missing if any(p in k for p in DFLASH2_ONLY)]
    wrong = sorted(set(missing) - set(fresh)) + sorted(unexpected)
    if wrong:
        raise ConfigError(f"drafter.init_from={parent.identity.source}: its weights do not fit its own config "
                          f"(missing or unexpected: {', '.join(wrong[:4])}{' ...' if len(wrong) > 4 else ''})")
    model.refresh_head()
    model.parent, model.initialised_not_loaded = parent.identity, fresh
    return model, parent.identity, fresh

