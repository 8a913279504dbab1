"""A run that trains on another run's features (`data.features_from`): the source's committed results, the
reader's record of them, and the source's list of its readers.

The source's prep, generate and extract results are read in place (flashdraft/storage/source.py `data_store`).
At its first task a reader commits, in its own store, the source's result fingerprints as it found them
(`source.json`) and, in the source's store, `readers/<run_id>.json`: the only object a reader ever writes there, so
the source's owner sees who reads it (and `--from` on the source asks for a confirmation). At every later task
the reader compares the source's fingerprints with those it started from: a source recomputed since is refused.
The comparison of the source's recorded settings with the reader's config is the runner's
(flashdraft/run/runner.py `check_source`), which owns fingerprints.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, Field

from flashdraft.config import ConfigError, RunConfig
from flashdraft.run import registry, status
from flashdraft.run.contract import Stage
from flashdraft.storage import layout
from flashdraft.storage.source import source_store, source_uri
from flashdraft.storage.store import ObjectStore


class SourceChanged(ConfigError):
    """The source's features are not (or no longer) what this run reads: not finished, changed since this run
    started, or made with other settings. One line naming the source and what differs."""


class SourceRecord(BaseModel):
    """A reader's record of its source, committed in both stores (the reader's `source.json`, the source's
    `readers/<run_id>.json`)."""

    source: str = Field(description="the source run's store URI (data.features_from)")
    reader: str = Field(description="the reader run's store URI")
    run_id: str = Field(description="the reader's run_id")
    fingerprints: dict[str, str] = Field(description="per source stage read (prep, generate, extract): the digest "
                                         "of its tasks' committed fingerprints when the reader started")
    started: float = Field(description="unix time of the reader's first task")


def source_stages() -> list[Stage]:
    """The stages whose results a reader takes from its source, in pipeline order."""
    return [s for s in registry.current() if s.makes_features]


def source_results(cfg: RunConfig) -> dict[str, list[status.StageRecord]]:
    """Per source stage, its committed task records in the source; refuses a source that is no run or whose
    stage has not finished there."""
    src, uri = source_store(cfg), source_uri(cfg)
    assert src is not None and uri is not None, "source_results is for a run with data.features_from"
    if not status.is_run(src):
        raise SourceChanged(f"data.features_from {uri}: no run there (no status/ or metrics/ committed)")
    out: dict[str, list[status.StageRecord]] = {}
    for stage in source_stages():
        records = status.stage_records(src, stage.name, stage.per_shard)
        done = [r for r in records if r is not None and r.state == "done" and r.fingerprint is not None]
        if not records or len(done) != len(records):
            raise SourceChanged(f"data.features_from {uri}: its {stage.name} has not finished there "
                                f"({len(done)} of {len(records)} tasks done): finish that run first")
        out[stage.name] = done
    return out


def fingerprints(results: dict[str, list[status.StageRecord]]) -> dict[str, str]:
    """Per source stage, one digest over its tasks' fingerprints and start times (in task order): the same
    settings recomputed (`--from` on the source) are other results, with other start times."""
    return {name: hashlib.sha256(json.dumps([(r.fingerprint, r.started) for r in records]).encode()).hexdigest()[:16]
            for name, records in results.items()}


def reader_key(run_id: str) -> str:
    return f"{layout.READERS}/{run_id}.json"


def register_reader(cfg: RunConfig, store: ObjectStore, found: dict[str, str]) -> SourceRecord:
    """At a reader's first task, commit its record in both stores; at a later one, refuse a source whose results
    changed since (`found`: the source's fingerprints now)."""
    uri = source_uri(cfg)
    assert uri is not None
    if store.is_committed(layout.SOURCE):
        started = SourceRecord.model_validate(store.get_json_verified(layout.SOURCE))
        changed = [k for k in sorted(set(started.fingerprints) | set(found))
                   if started.fingerprints.get(k) != found.get(k)]
        if started.source != uri or changed:
            what = f"it read {started.source}" if started.source != uri else f"{', '.join(changed)} changed there"
            raise SourceChanged(f"data.features_from {uri}: this run started from other source results ({what}); "
                                "its drafter would mix two datasets: start a new run_id")
        record = started
    else:
        record = SourceRecord(source=uri, reader=store.url(), run_id=cfg.run_id, fingerprints=found,
                              started=status.now())
        store.commit_json(layout.SOURCE, record.model_dump(mode="json"))
    src = source_store(cfg, read_only=False)
    assert src is not None
    if not src.is_committed(reader_key(cfg.run_id)):
        src.commit_json(reader_key(cfg.run_id), record.model_dump(mode="json"))
    return record


def readers(store: ObjectStore) -> list[SourceRecord]:
    """The runs that recorded reading this run's results (readers/), unreadable records skipped."""
    return status.read_committed(store, layout.READERS + "/", SourceRecord)


def read_source(store: ObjectStore) -> SourceRecord | None:
    """A reader run's record of its source (status and the report name it); None for a run with its own data."""
    if not store.is_committed(layout.SOURCE):
        return None
    return SourceRecord.model_validate(store.get_json_verified(layout.SOURCE))
