"""One tracker a stage logs through, fanned out to the trackers `tracking.report_to` names.

A stage never talks to TensorBoard, MLflow or W&B itself: it opens a `Tracker` for its task and logs scalars as it
measures them (`log("train", {...}, step)`). The tracker owns what every backend needs:

* one series per tag with global steps that never rewind: a step at or below the highest step this task already
  logged (a resumed trainer replaying from its checkpoint, a rerun of a reused stage) is dropped, so a kill and
  resume leaves one unbroken series. The high-water mark lives in the run's store (`tensorboard/<task>/progress.json`),
  so it survives the pod;
* failure isolation: a backend that raises (server down, bad credentials, a missing package) is a warning, once,
  and is then left out for the rest of the task. Never a failed stage, never a lost result: metrics/ in the store
  stay the record;
* the run config as flat parameters (`training.lr`), the run id as the run's name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from flashdraft.storage import layout

if TYPE_CHECKING:
    from flashdraft.config import RunConfig
    from flashdraft.storage.store import ObjectStore

log = logging.getLogger(__name__)


class Sink(Protocol):
    """One tracker backend (flashdraft/tracking/sinks.py)."""

    name: str

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def artifact(self, name: str, data: bytes) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def flat_numbers(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers in `values` as flat tags: nested mappings joined with "/", lists indexed from 1
    (`acc_by_pos/1`, the first draft position), booleans and text left out."""
    out: dict[str, float] = {}
    for key, value in values.items():
        tag = f"{prefix}{key}"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float):
            out[tag] = float(value)
        elif isinstance(value, Mapping):
            out.update(flat_numbers(value, f"{tag}/"))
        elif isinstance(value, list | tuple):
            out.update(flat_numbers({_item_name(i, v): v for i, v in enumerate(value)}, f"{tag}/"))
    return out


def _item_name(index: int, item: Any) -> str:
    """A list item's tag: its own `name` (an eval suite: `suites/heldout/tau`), else its position from 1."""
    name = item.get("name") if isinstance(item, Mapping) else None
    return str(name) if isinstance(name, str) and name else str(index + 1)


def flat_params(cfg: RunConfig) -> dict[str, str]:
    """The run config as the trackers take parameters: one string per leaf, dotted keys (`training.lr`)."""

    def walk(node: Any, path: str) -> Iterable[tuple[str, str]]:
        if isinstance(node, BaseModel):
            for name in type(node).model_fields:
                yield from walk(getattr(node, name), f"{path}.{name}" if path else name)
        else:
            yield path, str(node)

    return dict(walk(cfg, ""))


class Tracker:
    """The trackers of one task. `log` drops steps at or below the high-water mark of their prefix (module
    docstring) and copies buffered figures into the store every `flush_every_s` seconds."""

    def __init__(self, stage: str, sinks: list[Sink], store: ObjectStore | None = None, shard: int | None = None,
                 last_steps: Mapping[str, int] | None = None, flush_every_s: float = 30.0):
        self.stage, self.shard = stage, shard
        self.task = stage if shard is None else f"{stage} shard {shard}"
        self.sinks = list(sinks)
        self.store = store
        self.last_steps: dict[str, int] = dict(last_steps or {})
        self.flush_every_s = flush_every_s
        self._flushed_at = time.monotonic()
        self._warned: set[str] = set()

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sinks]

    def log(self, prefix: str, values: Mapping[str, Any], step: int) -> None:
        """Log the numbers of `values` as `<prefix>/<name>` at global step `step`; a step at or below the last one
        logged under `prefix` (by this task, in any attempt) is dropped."""
        if not self.sinks or step <= self.last_steps.get(prefix, -1):
            return
        metrics = flat_numbers(values, f"{prefix}/" if prefix else "")
        if metrics:
            self._each("log", metrics, step)
        self.last_steps[prefix] = step
        if time.monotonic() - self._flushed_at >= self.flush_every_s:
            self.flush()

    def artifact(self, name: str, data: bytes) -> None:
        """A file for the trackers that keep files (the report, the model card): `name` is its path there."""
        self._each("artifact", name, data)

    def flush(self) -> None:
        """Push buffered figures out now (TensorBoard's event files into the store), then record the high-water
        marks, so a pod killed after this point resumes without repeating these steps."""
        self._flushed_at = time.monotonic()
        self._each("flush")
        if self.store is not None and self.last_steps and self.sinks:
            try:
                stored = read_progress(self.store, self.stage, self.shard)  # another tracker of the task's
                merged = {k: max(v, stored.get(k, -1)) for k, v in self.last_steps.items()}
                self.store.put_json(layout.tracking_progress_key(self.stage, self.shard),
                                    {"last_steps": {**stored, **merged}})
            except Exception as exc:  # the store's own failure surfaces where the stage writes its results
                log.warning("tracking: could not record the logged steps of %s: %s", self.task, exc)

    def close(self) -> None:
        self.flush()
        self._each("close")

    def _each(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:
                self._drop(sink, exc)

    def _drop(self, sink: Sink, exc: BaseException) -> None:
        self.sinks.remove(sink)
        self.warn_failed(sink.name, exc)

    def warn_failed(self, name: str, exc: BaseException) -> None:
        """Warn once that tracker `name` failed; the task goes on without it."""
        if name not in self._warned:
            self._warned.add(name)
            detail = str(exc).splitlines()[0][:300] if str(exc) else ""
            log.warning("tracking: %s failed (%s: %s); %s goes on without it, and the store keeps every figure",
                        name, type(exc).__name__, detail, self.task)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_progress(store: ObjectStore, stage: str, shard: int | None = None) -> dict[str, int]:
    """The highest step each series of a task has logged, in any attempt ({} before its first)."""
    key = layout.tracking_progress_key(stage, shard)
    return {k: int(v) for k, v in store.get_json(key)["last_steps"].items()} if store.exists(key) else {}


def _sink(name: str, cfg: RunConfig, stage: str, shard: int | None, store: ObjectStore) -> Sink:
    from flashdraft.tracking import sinks

    if name == "tensorboard":
        return sinks.TensorBoardSink(store, layout.tensorboard_prefix(stage, shard))
    if name == "mlflow":
        return sinks.MlflowSink(cfg.run_id, flat_params(cfg))
    return sinks.WandbSink(cfg.run_id, flat_params(cfg), stage)


def open_tracker(cfg: RunConfig, stage: str, store: ObjectStore, shard: int | None = None) -> Tracker:
    """The trackers `cfg.tracking.report_to` names for one task (a stage, or one shard of it), resumed past the
    steps it already logged. A tracker that cannot open is the same one warning as one that fails later."""
    tracker = Tracker(stage, [], store, shard, flush_every_s=cfg.tracking.flush_every_s)
    if not cfg.tracking.report_to:
        return tracker
    tracker.last_steps = read_progress(store, stage, shard)
    for name in cfg.tracking.report_to:
        try:
            tracker.sinks.append(_sink(name, cfg, stage, shard, store))
        except Exception as exc:
            tracker.warn_failed(name, exc)
    return tracker


def log_result(cfg: RunConfig, store: ObjectStore, stage: str, shard: int | None, step: int,
               result: Mapping[str, Any], files: Mapping[str, bytes] | None = None) -> None:
    """A finished task's figures (its summary, bulky lists left out) under `<stage>/`, and the files the trackers
    keep (the report, the model card). `step`: the shard of a fanned-out stage, else the task's attempt, so a
    re-evaluation adds a point instead of being dropped as a repeat."""
    if not cfg.tracking.report_to:
        return
    try:
        with open_tracker(cfg, stage, store, shard) as tracker:
            tracker.log(stage, result, step)
            for name, data in (files or {}).items():
                tracker.artifact(name, data)
    except Exception as exc:  # the store itself failing here: the stage's result is committed already
        log.warning("tracking: could not log %s's figures: %s", stage, exc)
