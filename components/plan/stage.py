"""The plan stage's declaration (read by the registry, flashdraft/run/registry.py)."""

from flashdraft.components.plan.summary import PlanSummary
from flashdraft.run.stage import StageSpec

SPEC = StageSpec(
    "plan", PlanSummary, "cpu", 900, run="flashdraft.components.plan.planner:run_plan", reuse=False,
    doc="Storage, GPU-hour, per-GPU memory and cost plan; on a cluster the gate that refuses an over-budget run "
        "(storage, plan.max_cost_usd, plan.deadline_days), a config whose predicted peak memory exceeds a pool's "
        "GPU, or changed settings.",
    reads=("target", "data", "features", "mode", "plan", "pools", "training", "storage.budget_bytes", "drafter",
           "generation.tensor_parallel", "generation.max_model_len"),
    report="flashdraft.components.plan.report_section:report", cli="flashdraft.components.plan.cli:plan",
    component="flashdraft.pipelines.stages:plan_gate")
