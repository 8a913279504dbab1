"""What the plan adds to the run report: the projection for the planned dataset (GPU-hours per pool, bytes at
rest, the configured topology's cost and days beside the cheapest and the fastest alternative) under the verdict,
and the planned storage figures as scalars."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashdraft.components.plan.compare import summary_line
from flashdraft.run import registry
from flashdraft.run.reporting import RunView, StageReport, fmt, fmt_bytes

if TYPE_CHECKING:
    from flashdraft.components.plan.summary import PlanSummary


def report(plan: PlanSummary | None, run: RunView) -> StageReport:
    if plan is None:
        return StageReport()
    projected = projection(plan)
    out = StageReport(lead=[("Projection for the planned dataset (plan)", projected)] if projected else [])
    if plan.selected is not None:
        out.scalars = {"planned_bytes_per_token": float(plan.selected.bytes_per_token),
                       "planned_total_bytes": float(plan.selected.total_bytes)}
    return out


def projection(plan: PlanSummary) -> str | None:
    """For a run planned on GPU pools (a production target): the plan's GPU-hours per pool and bytes at rest for
    the whole planned dataset; None for a CPU run (no GPU-hours to project)."""
    pools: dict[str, list[float | str]] = {}
    for name, est in (plan.gpu_hours or {}).items():
        hours = est.gpu_hours
        if hours is None:
            continue
        try:
            pool = registry.current().get(name).pool
        except ValueError:
            pool = name
        entry = pools.setdefault(pool, [0.0, est.gpu or "GPU"])
        entry[0] = float(entry[0]) + float(hours)
    if not pools:
        return None
    hours = ", ".join(f"{pool} pool {h:,.1f} GPU-hours ({gpu})" for pool, (h, gpu) in pools.items())
    at_rest = fmt_bytes(plan.total_bytes_at_rest) if plan.total_bytes_at_rest is not None else "-"
    cost = summary_line(plan.comparison)
    return (f"{fmt(plan.samples)} samples x {fmt(plan.tokens_per_sample)} tokens: {hours}; {at_rest} of hidden "
            f"states at rest ({plan.codec}){'' if not plan.calibration else f'; rates from {plan.calibration}'}"
            + (f"; {cost}" if cost else ""))
