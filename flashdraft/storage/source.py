"""Where a run's training data lives: its own store, or, with `data.features_from`, the source run's store.

The one place the readers of prompts, responses and features (train's reader, evaluate's held-out suite, the
model card's token count) open their store, so a run that trains on another run's features reads them in place
and never copies them. The checks that the source matches the config sit in flashdraft/run/source.py.
"""

from __future__ import annotations

from flashdraft.config import ConfigError, RunConfig
from flashdraft.config.features import STORAGE_SCHEMES, split_uri
from flashdraft.storage.store import ObjectStore, open_store


def source_uri(cfg: RunConfig) -> str | None:
    """The source run's store URI, normalised (a file path made absolute); None for a run with its own data."""
    uri = cfg.data.features_from
    if uri is None:
        return None
    scheme, path = split_uri(uri)
    if scheme not in STORAGE_SCHEMES:
        raise ConfigError(f"data.features_from {uri!r}: unsupported scheme {scheme!r} (file://, s3:// or memory://)")
    return uri.rstrip("/")


def source_store(cfg: RunConfig, *, read_only: bool = True) -> ObjectStore | None:
    """The source run's store (storage.* settings of this run: endpoint, retries), None without a source.
    Read-only unless the caller writes its reader record (the only thing a dependent run writes there)."""
    uri = source_uri(cfg)
    if uri is None:
        return None
    return ObjectStore(uri, cfg.storage.model_copy(update={"root": uri}), read_only=read_only)


def data_store(cfg: RunConfig) -> ObjectStore:
    """The store holding this run's prompts, responses and features: the source's, else the run's own."""
    return source_store(cfg) or open_store(cfg.storage, cfg.run_id)
