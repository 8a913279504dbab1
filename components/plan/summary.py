"""The plan stage's summary: storage and GPU-hour plan, per-GPU memory, the gate."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from flashdraft.components.plan.compare import Comparison
from flashdraft.components.plan.evaluate_plan import EvaluatePlan
from flashdraft.components.plan.fetch import FetchPlan
from flashdraft.components.plan.sections import CodecPlan, StageEstimate, TargetSection
from flashdraft.run.stage import StageSummary, numbers


class PlanSummary(StageSummary):
    """components/plan/planner.py's plan, built typed by `make_plan`: storage and GPU-hour plan, per-GPU memory,
    the topology comparison and the gate (budget, free space, memory, cost, days)."""

    HEADLINE: ClassVar[tuple[str, str] | None] = (
        "planned_bytes_per_token",
        "{planned_bytes_per_token:,.0f} bytes/token planned, {planned_total_mb:,.1f} MB at rest")

    target: str | None = Field(None, description="target model id")
    layer_ids: list[int] | None = Field(None, description="target layers whose hidden states are extracted")
    num_layers: int | None = Field(None, description="target decoder layers")
    hidden_size: int | None = Field(None, description="target hidden size")
    target_geometry: TargetSection | None = Field(None, description="what the plan took the target to be")
    samples: int | None = Field(None, description="planned training samples")
    tokens_per_sample: int | None = Field(None, description="planned tokens per sample (prompt + response)")
    total_tokens: int | None = Field(None, description="samples x tokens_per_sample")
    bytes_per_token: int | None = Field(None, description="the naive bf16 layout's bytes per token (reference)")
    codecs: dict[str, CodecPlan] | None = Field(None, description="every codec's cost")
    codec: str | None = Field(None, description="the selected codec (features.codec)")
    total_bytes_at_rest: int | None = Field(None, description="offline: bytes stored at once with the selected codec")
    peak_bytes_streaming: int | None = Field(None, description="streaming: the window's peak bytes")
    objects: int | None = Field(None, description="objects the offline run stores")
    shards: int | None = Field(None, description="feature shards")
    tokens_to_generate: int | None = Field(None, description="response tokens the target generates")
    responses: str | None = Field(None, description="data.responses: target (generated) or dataset (no generation)")
    train_variants: int = Field(1, description="plan.train_variants: trainings of the same features; gpu_hours' "
                                "train row counts all of them")
    tokens_to_extract: int | None = Field(None, description="tokens extraction runs through the target")
    gpu_hours: dict[str, StageEstimate] | None = Field(None, description="per GPU stage: gpu, tokens, rate, GPU-hours")
    streaming_bandwidth_bytes_per_s: float | None = Field(None, description="streaming: store bandwidth needed")
    inference_per_trainer_gpu: float | None = Field(None, description="streaming: extract GPUs per trainer GPU")
    trainer_gpus: int | None = Field(None, description="training world size")
    evaluate: EvaluatePlan | None = Field(None, description="evaluate's GPU-hours and wall time against its timeout "
                                          "(components/plan/evaluate_plan.py); None on a CPU pool")
    mode: str | None = Field(None, description="mode.kind of the run")
    recommended_mode: str | None = Field(None, description="offline, streaming or 'none fits'")
    budget_bytes: int | None = Field(None, description="storage.budget_bytes")
    fits_budget: bool | None = Field(None, description="the offline data fits the budget")
    memory: dict[str, dict[str, Any]] | None = Field(
        None, description="per pool: peak_bytes_per_gpu, usable_bytes_per_gpu, fits, phase, parts, peak_source")
    train_flops_per_step: dict[str, float] | None = Field(None, description="one rank's step FLOPs by part")
    calibration: str | None = Field(None, description="where the calibration's measured figures come from")
    target_fetch: FetchPlan | None = Field(None, description="the Hub target's one fetch into the run's store: "
                                           "bytes, minutes, tasks reading it (None: a local or built target)")
    evaluate_only: bool | None = Field(None, description="a pretrained drafter evaluated as is: no features stored, "
                                       "no training, so only the inference pool's memory can refuse the run")
    comparison: Comparison | None = Field(
        None, description="every topology's cost, days and memory fit, sorted by total cost (plan --compare)")
    hub_datasets: list[dict[str, Any]] | None = Field(
        None, description="the plan task's look at every hf: source and suite (components/plan/hub_gate.py): entry, "
        "uri, config, splits, revision, the commit it resolved to and rows per split where the card says")
    free_alternatives: list[str] = Field(default_factory=list, description="what to measure before paying for "
                                         "training: prompt lookup, the target's MTP head, the published drafter, "
                                         "and the evaluate-only command that measures them on the run's prompts")
    gate: str | None = Field(None, description="why the run may not start (storage, free space, memory, cost, "
                             "days, evaluate's timeout, an hf: dataset that cannot be read as configured); None when "
                             "it may")

    def dump(self) -> dict[str, Any]:
        """The top-level keys the planner set, each section whole: a nested model's defaults (a topology row's
        `configured: false`, the comparison's caveat) are part of its value, as metrics/plan.json always held them
        (StageSummary.dump's exclude_unset would drop them)."""
        return self.model_dump(mode="json", include=set(self.model_fields_set))

    def handoff(self) -> dict[str, Any]:
        """`dump()`: the plan has no bulky field to leave out."""
        return self.dump()

    @property
    def selected(self) -> CodecPlan | None:
        """The selected codec's cost."""
        return (self.codecs or {}).get(self.codec or "")

    def figures(self) -> dict[str, float]:
        sel = self.selected
        return numbers({"planned_bytes_per_token": sel.bytes_per_token if sel else None,
                        "planned_total_bytes": sel.total_bytes if sel else None})

    @classmethod
    def headline_values(cls, figures: dict[str, float]) -> dict[str, Any]:
        return {**figures, "planned_total_mb": figures.get("planned_total_bytes", 0) / 1e6}
