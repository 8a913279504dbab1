"""The plan stage: the gate a cluster run passes before any GPU works (registered in components/stages.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flashdraft.components.plan.summary import PlanSummary
from flashdraft.run.contract import Stage

if TYPE_CHECKING:
    from flashdraft.config import RunConfig
    from flashdraft.run.reporting import RunView, StageReport


class Plan(Stage):
    name = "plan"
    summary = PlanSummary
    pool = "cpu"
    timeout_s = 900
    target_use = "recheck"
    reuse = False
    doc = ("Storage, GPU-hour, per-GPU memory and cost plan; on a cluster the gate that refuses an over-budget run "
           "(storage, plan.max_cost_usd, plan.deadline_days), a config whose predicted peak memory exceeds a pool's "
           "GPU, an hf: source or eval suite that cannot be read as configured (plan.check_sources), or changed "
           "settings.")
    reads = ("target", "data", "features", "mode", "plan", "pools", "training", "storage.budget_bytes", "drafter",
             "generation.tensor_parallel", "generation.max_model_len")

    def run(self, cfg: RunConfig, shard: int | None = None) -> PlanSummary:
        from flashdraft.components.plan.planner import run_plan

        return run_plan(cfg, open_sources=True)

    def command(self) -> Callable[..., None]:
        from flashdraft.components.plan.cli import plan

        return plan

    def report(self, summary: PlanSummary | None, run: RunView) -> StageReport:
        from flashdraft.components.plan.report_section import report

        return report(summary, run)
