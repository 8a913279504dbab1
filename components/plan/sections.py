"""The typed parts of a plan (components/plan/summary.py's PlanSummary): one codec's cost, one stage's tokens,
rate and GPU-hours, what the plan took the target to be. Their own module so compare.py, which the summary
imports, reads them too.

Field types are the exact JSON types the planner writes (an int stays an int), so metrics/plan.json keeps its bytes;
`int | float` where a figure is an int from the model's config and a float from a config hint.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CodecPlan(BaseModel):
    """One row of the plan's codec table."""

    model_config = ConfigDict(extra="allow")

    bytes_per_token: float | None = Field(description="stored bytes per token, all feature layers; None: unavailable")
    total_bytes: int | None = Field(
        description="bytes at rest for the whole run with this codec; None: unavailable")
    total_tb: float | None = Field(None, description="total_bytes in TB (1e12)")
    total_tib: float | None = Field(None, description="total_bytes in TiB (2**40)")
    lossless: bool = Field(description="the codec reproduces bf16 features exactly")
    unavailable: str | None = Field(None, description="why the codec cannot hold the target's rows (n/a in the table)")


class StageEstimate(BaseModel):
    """One GPU stage's tokens, rate and GPU-hours on its pool's GPU."""

    model_config = ConfigDict(extra="allow")

    gpu: str | None = Field(None, description="the pool's GPU type; None: a CPU pool")
    tokens: int = Field(description="tokens the stage runs through")
    tokens_per_s_per_gpu: float | None = Field(None, description="the rate; None without a GPU type")
    gpu_hours: float | None = Field(None, description="tokens / rate; None without a rate")
    rate_source: str | None = Field(None, description="where the rate comes from (rates.py)")


class TargetSection(BaseModel):
    """What the plan took the target to be, and where each figure came from (planner.planning_target)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(description="target.model")
    num_layers: int = Field(description="decoder layers")
    hidden_size: int = Field(description="hidden size")
    vocab_size: int = Field(description="vocabulary size")
    params: int | float = Field(description="total parameters, every expert included")
    active_params: int | float = Field(description="parameters one token runs through (MoE: its experts)")
    layer_types: dict[str, int] | None = Field(None, description="decoder layers per kind (hybrids)")
    sliding_window: int | None = Field(None, description="the window of its sliding-attention layers")
    attention_sinks: bool = Field(False, description="a learned per-head sink logit")
    experts: int = Field(0, description="routed experts of an MoE layer (0: dense)")
    experts_per_token: int = Field(0, description="experts a token runs through")
    from_model_files: bool = Field(False, description="the model's own config was read")
    sources: dict[str, str] = Field(default_factory=dict, description="each figure's source")
    hinted: list[str] = Field(default_factory=list, description="figures not from the model's own config")
