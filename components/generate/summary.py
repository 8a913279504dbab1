"""The generate stage's summary: one shard's DONE record."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from flashdraft.run.stage import StageSummary, numbers


class GenerateSummary(StageSummary):
    """components/generate/generate.py: one shard's DONE record (responses/shard-K/DONE)."""

    HEADLINE: ClassVar[tuple[str, str] | None] = (
        "samples",
        "{samples:,.0f} samples, {generated_tokens:,.0f} tokens, {tokens_per_s:,.1f} tokens/s{gemm}")

    shard: int | None = Field(None, description="generation shard")
    num_chunks: int | None = Field(None, description="response chunks of the shard")
    chunks_generated_now: int | None = Field(None, description="chunks this attempt generated (others were committed)")
    samples: int | None = Field(None, description="samples (prompts) generated")
    turns: int | None = Field(None, description="assistant turns generated")
    prompt_tokens: int | None = Field(None, description="prompt tokens")
    generated_tokens: int | None = Field(None, description="response tokens generated")
    empty: int | None = Field(None, description="empty responses")
    truncated: int | None = Field(None, description="responses cut at the length limit")
    generation_seconds: float | None = Field(None, description="generation time summed over chunks")
    tokens_per_s: float | None = Field(None, description="generated tokens per second")
    backend_startup_s: float | None = Field(None, description="backend load time of this attempt")
    backend: str | None = Field(None, description="generation.backend")
    forward_flops: float | None = Field(None, description="the target forward's FLOPs in this shard's chunks "
                                        "(components/generate/cost.py; hf backend on a CPU only)")
    gemm_flops_per_s: float | None = Field(None, description="this CPU's fp32 GEMM rate, measured by the attempt "
                                           "(flashdraft/perf/cpu_gemm.py); absent on a GPU and for vllm")
    gemm_share: float | None = Field(None, description="forward_flops / (generation_seconds x gemm_flops_per_s): "
                                     "how close generation runs to this CPU's GEMM limit")
    fingerprint: str | None = Field(None, description="the task's fingerprint (flashdraft/run/runner.py), also "
                                    "in every chunk's commit record")

    def figures(self) -> dict[str, float]:
        # summable over shards: the FLOPs done and the FLOPs this CPU's GEMM rate would have done in that time
        capacity = self.gemm_share and self.forward_flops / self.gemm_share
        return numbers({"samples": self.samples, "generated_tokens": self.generated_tokens,
                        "generation_seconds": self.generation_seconds, "forward_flops": capacity and self.forward_flops,
                        "gemm_capacity_flops": capacity})

    @classmethod
    def derive(cls, figures: dict[str, float]) -> dict[str, float]:
        out = dict(figures)
        if figures.get("generation_seconds"):
            out["tokens_per_s"] = round(figures.get("generated_tokens", 0) / figures["generation_seconds"], 1)
        if figures.get("gemm_capacity_flops"):
            out["gemm_share"] = round(figures.get("forward_flops", 0) / figures["gemm_capacity_flops"], 4)
        return out

    @classmethod
    def headline_values(cls, figures: dict[str, float]) -> dict[str, Any]:
        values = cls.derive(figures)
        share = values.get("gemm_share")
        return {**values, "gemm": f", gemm share {share:.0%}" if share is not None else ""}
