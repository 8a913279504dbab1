"""The one stage runner: every task of every stage runs through `run_task`, whether started by `flashdraft
<stage>`, `flashdraft run-local` or a pipeline pod (as in datatrove's executor, the runner, not the stage, owns
completion, reuse and the status record).

A task's fingerprint is the config fields its stage reads (its declared sections, less the fields that cannot
change a result; components/<stage>/stage.py) plus the fingerprints of the upstream results it reads. Against the
task's committed record (docs/stages.md):

* same fingerprint, result committed: reused ("reused: fingerprint matches"), nothing runs;
* same fingerprint, no committed result (crash, failure, kill): the stage runs and resumes from its committed work;
* changed only in what the stage declares it can carry on from (`continue_on`): it runs again and carries on;
* any other change: refused with one line naming the changed fields and the choices (a new run_id, or
  `--from <stage>`). Nothing is overwritten.

Before any of that, a task takes its lease in the run's store (one writer per task: a second one is refused
naming the holder; flashdraft/storage/lease.py) and is refused while an upstream task it reads is not done
(`UpstreamIncomplete`), so no result is recorded against an unknown upstream.

`check_run` applies the same comparison to every stage before a run starts, so a refused change stops the run
before any stage works. Each task ends with a committed `status/<task>.json` record (fingerprint and the config
values behind it) and, for reusable stages, `metrics/<task>.json`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from flashdraft.config import ConfigError, RunConfig
from flashdraft.run import registry, source, status
from flashdraft.run.contract import Stage
from flashdraft.run.events import emit, task_output
from flashdraft.run.stage import StageSummary, numbers
from flashdraft.run.status import REUSED
from flashdraft.run.target_pin import pinned_target
from flashdraft.storage import layout
from flashdraft.storage.lease import LeaseHeld, LeaseLost, TaskLease
from flashdraft.storage.source import source_store
from flashdraft.storage.store import COMMIT_SUFFIX, ObjectStore, open_store
from flashdraft.tracking import log_result

log = logging.getLogger(__name__)


class StageInputsChanged(ConfigError):
    """A stage's committed result was made with settings (or upstream results) that have since changed, in a way
    the stage cannot carry on from. The message is one line naming the fields and the choices."""


# -- fingerprints -------------------------------------------------------------------------------------------


def _leaves(value: Any, path: str) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        out: dict[str, Any] = {}
        for name in type(value).model_fields:
            out.update(_leaves(getattr(value, name), f"{path}.{name}"))
        return out
    return {path: to_jsonable_python(value)}


def _ignored(key: str, ignores: Iterable[str]) -> bool:
    return any(key == i or key.startswith(i + ".") for i in ignores)


def config_inputs(stage: Stage, cfg: RunConfig) -> dict[str, Any]:
    """The config values a stage's result depends on, by dotted field name (every field of a declared section)."""
    out: dict[str, Any] = {}
    for path in stage.reads:
        node: Any = cfg
        for part in path.split("."):
            if not isinstance(node, BaseModel) or part not in type(node).model_fields:
                raise ValueError(f"stage {stage.name!r} reads {path!r}, which is not a config field")
            node = getattr(node, part)
        out.update(_leaves(node, path))
    out = {k: v for k, v in sorted(out.items()) if not _ignored(k, stage.ignores_for(cfg))}
    if "drafter.init_from" in out and cfg.drafter.init == "pretrained":
        from flashdraft.drafter.pretrained import weights_digest

        out[PARENT_WEIGHTS] = weights_digest(cfg.drafter.init_from, cfg.storage)
    return out


# The pretrained drafter's identity beside drafter.init_from (the same name can come to hold other weights). Not a
# config field: a record made before it existed has no such field, and `_field_default` reads None for it.
PARENT_WEIGHTS = "drafter.init_from@sha256"


def task_inputs(stage: Stage, cfg: RunConfig) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(inputs, ignorable): `config_inputs` plus what the stage resolves its config to now (`Stage.resolved_inputs`:
    prep's source commits and file digests), and the fields `changed_fields` skips where a record lacks them (the
    stage's `ignores`, and the resolved ones: a record made before flashdraft resolved them is not refused for it)."""
    resolved = stage.resolved_inputs(cfg)
    return {**config_inputs(stage, cfg), **resolved}, (*stage.ignores, *resolved)


def _config_field(path: str) -> FieldInfo | None:
    """The RunConfig field at a dotted path (None for a name that is not one, such as PARENT_WEIGHTS)."""
    model: Any = RunConfig
    field = None
    for part in path.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        field = model.model_fields[part]
        model = field.annotation
    return field


def _field_default(path: str) -> Any:
    """A config field's default (for a field that a record made before the field existed does not hold)."""
    field = _config_field(path)
    return None if field is None else to_jsonable_python(field.get_default(call_default_factory=True))


def _recorded(path: str, value: Any) -> Any:
    """A recorded value in today's shape: the items of a list of sections (data.sources) gain, at their defaults,
    the fields added to flashdraft since the record was made, so an upgrade alone changes nothing."""
    field = _config_field(path)
    item = next(iter(get_args(field.annotation)), None) if field is not None else None
    if not (isinstance(value, list) and isinstance(item, type) and issubclass(item, BaseModel)):
        return value
    try:
        return [to_jsonable_python(item.model_validate(v)) for v in value]
    except ValidationError:
        return value


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def upstream_fingerprints(store: ObjectStore, stage: Stage, cfg: RunConfig,
                          shard: int | None) -> dict[str, str | None]:
    """Per upstream stage, the fingerprint of the committed result this task reads: the same shard's for a
    per-shard stage reading a per-shard one, all shards' together for a fan-in; None when not committed. An
    upstream stage read from a data.features_from source is that run's result."""
    out: dict[str, str | None] = {}
    run_store = store
    for name in registry.current().upstream_in(stage, cfg):
        up = registry.current().get(name)
        store = (source_store(cfg) or run_store) if up.from_source(cfg) else run_store
        if up.per_shard and shard is not None:
            record = status.read_record(store, name, shard)
            out[name] = record.fingerprint if record and record.state == "done" else None
        elif up.per_shard:
            records = [status.read_record(store, name, k) for k in status.shards(store, name)]
            fps = [r.fingerprint if r and r.state == "done" else None for r in records]
            out[name] = _digest(fps) if fps and None not in fps else None
        else:
            record = status.read_record(store, name)
            out[name] = record.fingerprint if record and record.state == "done" else None
    return out


class UpstreamIncomplete(ConfigError):
    """A task started before the upstream results it reads were all committed (a train while an extract shard
    still runs): refused, never recorded with an unknown upstream. The message is one line naming the tasks."""


def _expected_shards(store: ObjectStore) -> int | None:
    """How many shards prep made (its committed prompts manifest), None before prep committed it."""
    if not store.is_committed(layout.PROMPTS_MANIFEST):
        return None
    return int(store.get_json_verified(layout.PROMPTS_MANIFEST)["summary"]["num_shards"])


def incomplete_upstream(store: ObjectStore, stage: Stage, cfg: RunConfig, shard: int | None) -> list[str]:
    """The upstream tasks this task reads that ran (or are known to exist: every shard prep made) but have no done
    record with a fingerprint: '<task> <state>'. An upstream stage with no record at all and no known shards ran
    outside the runner (a test's stand-in, an older run) and is not listed: its fingerprint stays unrecorded."""
    out: list[str] = []
    for name in registry.current().upstream_in(stage, cfg):
        up = registry.current().get(name)
        up_store = (source_store(cfg) or store) if up.from_source(cfg) else store
        expected = _expected_shards(up_store) if up.per_shard and shard is None else None
        if not up.per_shard:
            wanted: list[int | None] = [None]
        elif shard is not None:
            wanted = [shard]
        else:
            wanted = list(range(expected)) if expected is not None else list(status.shards(up_store, name))
        for k in wanted:
            record = status.read_record(up_store, name, k)
            if record is None and expected is None:
                continue  # no record and none known to be due: run outside the runner
            if record is None or record.state != "done" or record.fingerprint is None:
                out.append(f"{status.task_name(name, k)} {record.state if record else 'not started'}")
    return out


@dataclass(frozen=True)
class Fingerprint:
    """What a task's result depends on, and its digest (recorded in the task's status record)."""

    inputs: dict[str, Any]
    upstream: dict[str, str | None]

    @property
    def digest(self) -> str:
        return _digest({"inputs": self.inputs, "upstream": self.upstream})


def task_fingerprint(cfg: RunConfig, stage_name: str, shard: int | None = None,
                     store: ObjectStore | None = None) -> Fingerprint:
    stage = registry.current().get(stage_name)
    store = store or open_store(cfg.storage, cfg.run_id)
    inputs, _ = task_inputs(stage, cfg)
    return Fingerprint(inputs, upstream_fingerprints(store, stage, cfg, shard))


def changed_fields(record: status.StageRecord, inputs: dict[str, Any],
                   upstream: dict[str, str | None] | None = None,
                   ignorable: Iterable[str] = ()) -> dict[str, tuple[Any, Any]]:
    """What differs from a committed record: config fields as (committed, now), upstream stages as
    ("upstream <stage>", (committed fingerprint, now)). A field the record does not hold (added to flashdraft
    since) counts as unchanged while it keeps its default; an upstream result without a recorded fingerprint on
    either side (a stage run outside the runner) is not compared. `ignorable`: the stage's `ignores`; such a field
    that the record does not hold was ignored in the setting it was made in (Stage.ignores_for), not compared."""
    out: dict[str, tuple[Any, Any]] = {}
    for key, now in inputs.items():
        if key not in record.inputs and _ignored(key, ignorable):
            continue
        before = _recorded(key, record.inputs[key]) if key in record.inputs else _field_default(key)
        if before != now:
            out.update(_item_changes(key, before, now))
    for name, now in (upstream or {}).items():
        before = record.upstream.get(name)
        if before is not None and now is not None and before != now:  # None: not recorded (run outside the runner)
            out[f"upstream {name}"] = (before, now)
    return out


def _item_changes(key: str, before: Any, now: Any) -> dict[str, tuple[Any, Any]]:
    """A changed list of sections of the same length by item and field (`data.sources[1].heldout`), so the refusal
    names what changed; any other value as a whole."""
    items = isinstance(before, list) and isinstance(now, list) and len(before) == len(now)
    if not (items and all(isinstance(v, dict) for v in before + now)):
        return {key: (before, now)}
    return {f"{key}[{i}].{name}": (b.get(name), n.get(name)) for i, (b, n) in enumerate(zip(before, now, strict=True))
            for name in sorted(b.keys() | n.keys()) if b.get(name) != n.get(name)}


def _continues(stage: Stage, cfg: RunConfig, change: str) -> bool:
    for c in stage.continue_on_for(cfg):
        if c == "*" or change == c or change.startswith(c + ".") or change == f"upstream {c}":
            return True
    return False


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def refusal(task: str, stage: Stage, changes: dict[str, tuple[Any, Any]]) -> StageInputsChanged:
    """The one-line refusal: the changed fields, then the choices."""
    fields = [k for k in changes if not k.startswith("upstream ")]
    upstream = [k.removeprefix("upstream ") for k in changes if k.startswith("upstream ")]
    start = stage.name if fields else next((s for s in registry.current().names() if s in upstream), stage.name)
    detail = ", ".join(f"{k} {_short(a)} -> {_short(b)}" for k, (a, b) in changes.items()
                       if not k.startswith("upstream "))
    what = detail if detail else f"the result of {', '.join(upstream)}"
    cleared = ", ".join(registry.current().downstream(start))
    return StageInputsChanged(
        f"{task}: changed since its committed result: {what}; keep the old settings, use a new run_id "
        f"(--set run_id=NEW), or recompute with `--from {start}` ({cleared})")


# -- running a task -----------------------------------------------------------------------------------------


def _emit_and_commit(store: ObjectStore, record: status.StageRecord, commit: bool = True) -> None:
    """Tell the local console, and commit the task's status record; a store failure here is logged, never raised:
    it must not replace the stage's own outcome (or its own error)."""
    emit({"kind": "task", "record": record.model_dump(mode="json")})
    if not commit:
        return
    try:
        store.commit_json(status.status_key(record.stage, record.shard), record.model_dump(mode="json"))
    except Exception:  # noqa: BLE001
        log.warning("could not commit the status record of %s", record.task, exc_info=True)


def _committed_result(store: ObjectStore, stage: Stage, shard: int | None) -> StageSummary | None:
    key = layout.metrics_key(status.task_name(stage.name, shard))
    if not store.is_committed(key):
        return None
    return registry.current().summary_of(stage.name, {**store.get_json_verified(key), "skipped": True})


def _target_for(stage: Stage, cfg: RunConfig, store: ObjectStore) -> contextlib.AbstractContextManager:
    """The run's pinned target while `stage`'s task runs (`Stage.target_use`). The plan gate leaves a target that
    flashdraft builds (tiny, random, smollm2-pypi: fixed by their settings) to the first stage that builds it."""
    use = stage.target_use
    if use == "none" or (use == "recheck" and cfg.target.source != "hf"):
        return contextlib.nullcontext()
    return pinned_target(cfg, store, recheck=use == "recheck", fetch=use == "fetch")


def run_task(cfg: RunConfig, stage_name: str, shard: int | None = None, *,
             body: Callable[[], StageSummary | dict[str, Any]] | None = None, force: bool = False,
             metrics: Any = None) -> StageSummary:
    """Run one task (a stage, or one shard of a per-shard stage) under the runner's rules (module docstring).

    body: what to call instead of the stage's own `run` (a CLI's options, a pipeline's launcher).
    force: run even when the committed result's fingerprint matches or the change would be refused (the old
    `evaluate --force`). metrics: a KFP Metrics artifact for the task's figures and duration.
    The task holds its lease (flashdraft/storage/lease.py) from before its first read of the run's records to its
    last write: a second writer is refused (LeaseHeld) naming the holder. A task whose upstream results are not
    all committed is refused (UpstreamIncomplete). The stage's own exception propagates unchanged (KFP and
    kfp.local still see the task fail)."""
    stage = registry.current().get(stage_name)
    skipped = stage.skip_reason(cfg)
    if skipped is not None:
        raise ConfigError(f"{stage.name}: {skipped}")
    store = open_store(cfg.storage, cfg.run_id)
    lease = TaskLease(store, status.task_name(stage.name, shard), expiry_s=cfg.storage.lease_expiry_s,
                      heartbeat_s=cfg.storage.lease_heartbeat_s)
    try:
        lease.acquire()
    except LeaseHeld as exc:  # on the console as the task's failure, like any refusal
        previous = status.read_record(store, stage.name, shard)
        raise _refuse(store, stage, shard, previous.attempt + 1 if previous else 1, exc) from None
    with lease:
        return _run_leased(cfg, stage, shard, store, lease, body=body, force=force, metrics=metrics)


def _refuse(store: ObjectStore, stage: Stage, shard: int | None, attempt: int, exc: Exception) -> Exception:
    """Tell the console a task was refused, without committing: the committed record stays as it was."""
    now = status.now()
    _emit_and_commit(store, status.StageRecord(
        stage=stage.name, shard=shard, state="failed", started=now, ended=now, attempt=attempt,
        error_type=type(exc).__name__, error=str(exc)), commit=False)
    return exc


def _run_leased(cfg: RunConfig, stage: Stage, shard: int | None, store: ObjectStore, lease: TaskLease, *,
                body: Callable[[], StageSummary | dict[str, Any]] | None, force: bool, metrics: Any) -> StageSummary:
    """run_task's work once the task's lease is held."""
    if stage.reuse and cfg.data.features_from is not None:
        check_source(cfg, store)
    task = status.task_name(stage.name, shard)
    previous = status.read_record(store, stage.name, shard)
    attempt = previous.attempt + 1 if previous else 1
    missing = incomplete_upstream(store, stage, cfg, shard) if stage.reuse else []
    if missing:
        raise _refuse(store, stage, shard, attempt, UpstreamIncomplete(
            f"{task}: its upstream is not complete ({', '.join(missing)}): run it after those tasks are done "
            "(resubmitting the run finishes them first and reuses what is committed)"))
    inputs, ignorable = task_inputs(stage, cfg)
    fp = Fingerprint(inputs, upstream_fingerprints(store, stage, cfg, shard))
    if stage.reuse and not force and previous is not None and previous.fingerprint is not None:
        changes = changed_fields(previous, fp.inputs, fp.upstream, ignorable)
        if not changes and previous.state == "done":
            result = _committed_result(store, stage, shard)
            if result is not None:
                log.info("%s: %s (%s)", task, REUSED, previous.fingerprint)
                # started/ended stay those of the run that made the result: status and the report show how long
                # it took beside "reused"; reused_at says when it was reused
                _emit_and_commit(store, previous.model_copy(update={
                    "reused": True, "reused_at": status.now(), "attempt": attempt,
                    "log": status.task_log_location()}))
                _log_metrics(metrics, stage, result, previous.figures, 0.0)
                return result
        refused = {k: v for k, v in changes.items() if not _continues(stage, cfg, k)}
        if refused:
            raise _refuse(store, stage, shard, attempt, refusal(task, stage, refused))
        if changes:
            log.info("%s: carrying on from its committed work after a change of %s", task, ", ".join(changes))
    return _run_body(cfg, stage, shard, store, lease, fp, attempt, body=body, metrics=metrics)


def _run_body(cfg: RunConfig, stage: Stage, shard: int | None, store: ObjectStore, lease: TaskLease,
              fp: Fingerprint, attempt: int, *, body: Callable[[], StageSummary | dict[str, Any]] | None,
              metrics: Any) -> StageSummary:
    """Run the stage (or `body`) and commit its status record, running, then done or failed. A task whose lease
    was taken over meanwhile commits nothing more: the writer that took it owns the records now."""
    task = status.task_name(stage.name, shard)
    with task_output(task) as log_path:
        record = status.StageRecord(stage=stage.name, shard=shard, state="running", started=status.now(),
                                    attempt=attempt, log=log_path or status.task_log_location(),
                                    fingerprint=fp.digest, inputs=fp.inputs, upstream=fp.upstream)
        _emit_and_commit(store, record)
        try:
            with _target_for(stage, cfg, store):
                result = body() if body is not None else stage.run(cfg, shard)
            if lease.lost:
                raise LeaseLost(f"{task}: this writer stalled past its lease's expiry and {lease.lost} took the "
                                "task over; its result is not committed from here")
            summary = registry.current().summary_of(stage.name, result)
            if stage.reuse and not stage.commits_result:
                store.commit_json(layout.metrics_key(task), summary.dump())
        except BaseException as exc:
            log.error("%s failed", task, exc_info=True)  # the traceback, in its log
            message = str(exc)
            if len(message) > status.MAX_ERROR_CHARS:
                message = message[: status.MAX_ERROR_CHARS] + " [truncated; the log has it all]"
            _emit_and_commit(store, record.model_copy(update={"state": "failed", "ended": status.now(),
                                                              "error_type": type(exc).__name__, "error": message}),
                             commit=lease.lost is None)
            raise
        figures = summary.figures()
        device = summary.device
        done = record.model_copy(update={"state": "done", "ended": status.now(), "figures": figures, "device": device,
                                         "headline": stage.summary.headline(figures)
                                         + (f" (on {device})" if device else "")})
        _emit_and_commit(store, done)
    _log_metrics(metrics, stage, summary, figures, done.duration_s or 0.0)
    # the trackers (tracking.report_to): a fanned-out stage's shard as the step, else the attempt, so a re-evaluation
    # adds a point; the train series themselves are logged step by step by the trainer
    log_result(cfg, store, stage.name, shard, shard if shard is not None else attempt,
               {**summary.handoff(), **stage.summary.derive(figures), "duration_s": done.duration_s or 0.0},
               stage.tracked_files(store))
    return summary


def _log_metrics(metrics: Any, stage: Stage, summary: StageSummary, figures: dict[str, float],
                 duration_s: float) -> None:
    """The one place a task's KFP metrics (shown in the UI) are logged: the summary's numbers (top level and one
    level down, e.g. drafter_tau), the stage's figures with the rates derived from them, and the duration (0 when
    reused)."""
    if metrics is None:
        return
    values = {**numbers(summary.dump()), **stage.summary.derive(figures), "duration_s": duration_s}
    for key, value in values.items():
        metrics.log_metric(key, float(value))


# -- before a run -------------------------------------------------------------------------------------------


def check_run(cfg: RunConfig, store: ObjectStore | None = None) -> None:
    """Refuse, before any stage runs, a config whose changes no committed stage can carry on from.

    Compares the config fields of every stage with a committed record (upstream results cannot have changed yet:
    they change only through these fields). Raises StageInputsChanged naming the earliest such stage."""
    store = store or open_store(cfg.storage, cfg.run_id)
    if cfg.data.features_from is not None:
        check_source(cfg, store)
    for stage in registry.current():
        if not stage.reuse or stage.from_source(cfg):
            continue
        records = [r for r in status.stage_records(store, stage.name, stage.per_shard)
                   if r is not None and r.fingerprint is not None]
        if not records:
            continue
        inputs, ignorable = task_inputs(stage, cfg)
        for record in records:
            changes = changed_fields(record, inputs, ignorable=ignorable)
            refused = {k: v for k, v in changes.items() if not _continues(stage, cfg, k)}
            if refused:
                raise refusal(record.task, stage, refused)


def check_source(cfg: RunConfig, store: ObjectStore) -> None:
    """data.features_from: the source's prep, generate and extract results are what this config would have made
    (their recorded settings against this config, field by field) and the ones this run started from
    (flashdraft/run/source.py); records this run as the source's reader at its first task. Raises SourceChanged
    in one line naming the fields."""
    results = source.source_results(cfg)
    for name, records in results.items():
        inputs = config_inputs(registry.current().get(name), cfg)
        changes: dict[str, tuple[Any, Any]] = {}
        for record in records:
            changes.update(changed_fields(record, inputs, ignorable=registry.current().get(name).ignores))
        if changes:
            detail = ", ".join(f"{k} {_short(a)} -> {_short(b)}" for k, (a, b) in changes.items())
            raise source.SourceChanged(
                f"data.features_from {cfg.data.features_from}: its {name} results were made with other settings "
                f"than this config's ({detail}); the features depend on them: set them as the source has them, or "
                "leave data.features_from unset to make features of its own")
    source.register_reader(cfg, store, source.fingerprints(results))


def clear_from(cfg: RunConfig, stage_name: str, store: ObjectStore | None = None, *,
               confirm_readers: bool = False) -> list[str]:
    """`--from <stage>`: delete the committed results of `stage_name` and of every stage after it that reads it
    (outputs, metrics, status records), so they are recomputed; returns the stages cleared. Clearing results
    other runs read (data.features_from; flashdraft/run/source.py) needs `confirm_readers`: those runs are then
    refused at their next task."""
    store = store or open_store(cfg.storage, cfg.run_id)
    try:
        first = registry.current().get(stage_name)
    except ValueError as exc:
        raise ConfigError(f"--from {stage_name}: {exc}") from None
    skipped = first.skip_reason(cfg)
    if skipped is not None:  # its outputs may be another stage's (dataset replies are prep's): recompute from there
        raise ConfigError(f"--from {stage_name}: {skipped}; recompute from a stage this run has (--from prep)")
    names = registry.current().downstream(first.name)
    readers = source.readers(store) if any(registry.current().get(n).makes_features for n in names) else []
    if readers and not confirm_readers:
        named = ", ".join(f"{r.run_id} ({r.reader})" for r in readers)
        raise ConfigError(f"--from {stage_name}: runs read this run's results with data.features_from: {named}; "
                          "recomputing them refuses those runs' next tasks: pass --confirm-readers to go on")
    records = store.list(layout.STATUS + "/") + store.list(layout.METRICS + "/")
    for name in names:
        stage = registry.current().get(name)
        own = {k for k in records if _task_key_of(k, name)}
        for out in stage.outputs:
            own.update(store.list(out) if out.endswith("/") else
                       [k for k in (out, out + COMMIT_SUFFIX) if store.exists(k)])
        for key in sorted(own, key=lambda k: not k.endswith(COMMIT_SUFFIX)):  # records first: readers stop seeing
            store.delete(key)
        log.info("--from %s: cleared %s (%d objects)", stage_name, name, len(own))
    return names


def _task_key_of(key: str, name: str) -> bool:
    """A `status/` or `metrics/` key of stage `name` itself (`train.json`, `extract-shard-00001.json`), not of a
    stage whose name starts the same way."""
    for folder in (layout.STATUS, layout.METRICS):
        if key.startswith(folder + "/"):
            return status.stage_of(key[len(folder) + 1:].split(".json", 1)[0]) == name
    return False
