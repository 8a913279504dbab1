"""A run as its report reads it: the metrics and stage records committed to its store, each stage's summary typed.

Shared by the report and `flashdraft compare` (which also reads the runs a report lists), so a figure means the same
thing in both.
"""

from __future__ import annotations

from typing import Any

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.components.plan.summary import PlanSummary
from flashdraft.run import registry, status
from flashdraft.run.overview import stage_statuses
from flashdraft.run.reporting import RunView
from flashdraft.storage import layout
from flashdraft.storage.store import NotCommittedError, ObjectStore


def stage_metrics(store: ObjectStore) -> dict[str, dict[str, Any]]:
    """Every committed metrics/<name>.json by name (e.g. "train", "extract-shard-00001"); unreadable files are
    reported in place of their content so one bad file cannot hide the rest."""
    out: dict[str, dict[str, Any]] = {}
    for key in store.list_committed(layout.METRICS + "/"):
        name = layout.metrics_name(key)
        if name is None:
            continue
        try:
            out[name] = store.get_json_verified(key)
        except Exception as exc:  # noqa: BLE001 - the report must render whatever else exists
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def gather(store: ObjectStore, config: dict[str, Any] | None, run_over: bool = False) -> RunView:
    """The run as the report reads it. run_over: called as the run's exit handler, so a task whose record still
    says running died without recording an outcome and is shown failed."""
    metrics = stage_metrics(store)
    statuses = stage_statuses(status.read_records(store), metrics, run_over=run_over)
    summaries = {spec.name: spec.summary.model_validate(metrics[spec.name]) for spec in registry.current()
                 if spec.name in metrics and set(metrics[spec.name]) != {"error"}}
    # the config's target; a report regenerated without one takes what the plan or evaluate recorded
    plan, evaluated = summaries.get("plan"), summaries.get("evaluate")
    target = (((config or {}).get("target") or {}).get("model")
              or (plan.target if isinstance(plan, PlanSummary) else None)
              or (evaluated.target_model if isinstance(evaluated, EvaluateSummary) else None))
    return RunView(run=store.root, store=store, config=config, metrics=metrics, statuses=statuses,
                   summaries=summaries, target=target)


def stored_config(store: ObjectStore) -> dict[str, Any] | None:
    """The config an earlier report run stored with the run (None before any report ran)."""
    try:
        return store.get_json_verified(layout.REPORT_CONFIG)
    except NotCommittedError:
        return None
