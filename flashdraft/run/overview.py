"""A run's stages at a glance: one `StageStatus` per registered stage from the tasks' committed records, for the
local console, `flashdraft status` and the report. Apart from status.py (the records themselves) because it walks
the registry, which the records do not need.
"""

from __future__ import annotations

from collections.abc import Iterable

from flashdraft.run import registry
from flashdraft.run.status import NOT_RUN, StageRecord, StageState, StageStatus, combine, stage_of


def stage_statuses(records: Iterable[StageRecord], metrics_names: Iterable[str] = (),
                   run_over: bool = False) -> list[StageStatus]:
    """One StageStatus per pipeline stage, in pipeline order (the exit handler, the report, excluded; stream-end only
    when present).

    metrics_names: names of committed metrics files (`train`, `extract-shard-00001`): a stage with metrics but no
    record ran outside the pipeline and counts as done. run_over: the run has ended (the exit handler), so a task
    still `running` died without a word (killed, out of memory, node lost) and reads failed."""
    by_stage: dict[str, list[StageRecord]] = {}
    for r in records:
        by_stage.setdefault(r.stage, []).append(r)
    with_metrics = {stage_of(n) for n in metrics_names}
    out = []
    for spec in registry.current():
        stage = spec.name  # a pipeline-only step (stream-end) shows only when it ran
        if spec.exit_handler or (not spec.has_command and stage not in by_stage):
            continue
        tasks = sorted(by_stage.get(stage, []), key=lambda r: (r.shard is not None, r.shard or 0))
        if run_over:
            tasks = [t.model_copy(update={"state": "failed", "error": "the task ended without recording an "
                                          "outcome (killed, out of memory or its node lost?)"})
                     if t.state == "running" else t for t in tasks]
        if not tasks:
            out.append(StageStatus(stage=stage, state="done" if stage in with_metrics else NOT_RUN))
            continue
        states = {t.state for t in tasks}
        state: StageState = "failed" if "failed" in states else "running" if "running" in states else "done"
        ran = [t for t in tasks if not t.reused] or tasks  # partly reused: this run's tasks; all: the original's
        ends = [t.ended for t in ran if t.ended is not None]
        duration = round(max(ends) - min(t.started for t in ran), 2) if ends and state != "running" else None
        figs = combine(t.figures for t in tasks if t.state == "done")
        out.append(StageStatus(stage=stage, state=state, tasks=tasks, duration_s=duration,
                               headline=spec.summary.headline(figs), figures=spec.summary.derive(figs)))
    return out
