"""The extract stage's summary: one shard's DONE record and its parts."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from flashdraft.run.stage import StageSummary, numbers


class PartStats(BaseModel):
    """One committed feature part (from its commit record, or a streamed part's tombstone)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="store key of the part")
    samples: int | None = Field(description="samples in the part")
    tokens: int | None = Field(description="tokens in the part")
    bytes: int = Field(description="stored size")
    sha256: str = Field(description="content checksum")


class ExtractSummary(StageSummary):
    """components/extract/extract.py: one shard's DONE record (features/shard-K/DONE), with `store_io` added to
    what the stage returns; built field by field, so an unknown key is an error."""

    model_config = ConfigDict(extra="forbid")

    HEADLINE: ClassVar[tuple[str, str] | None] = (
        "samples",
        "{samples:,.0f} samples, {tokens:,.0f} tokens, {bytes_per_token:,.1f} bytes/token, "
        "{tokens_per_s:,.0f} tokens/s")

    shard: int | None = Field(None, description="generation shard extracted")
    backend: str | None = Field(None, description="features.backend")
    codec: dict[str, Any] | None = Field(None, description="codec parameters")
    layer_ids: list[int] | None = Field(None, description="target layers extracted")
    samples: int | None = Field(None, description="samples stored")
    tokens: int | None = Field(None, description="tokens stored")
    bytes: int | None = Field(None, description="bytes stored")
    parts: list[PartStats] | None = Field(None, description="the shard's parts")
    skipped_empty_samples: int | None = Field(None, description="responses without tokens, not extracted")
    resumed_from_sample: int | None = Field(None, description="samples already committed before this attempt")
    new_tokens: int | None = Field(None, description="tokens this attempt extracted")
    elapsed_s: float | None = Field(None, description="this attempt's extraction time")
    tokens_per_s: float | None = Field(None, description="new_tokens / elapsed_s")
    bytes_per_token: float | None = Field(None, description="bytes / tokens")

    def figures(self) -> dict[str, float]:
        return numbers({"samples": self.samples, "tokens": self.tokens, "bytes": self.bytes,
                        "new_tokens": self.new_tokens, "extract_seconds": self.elapsed_s})

    @classmethod
    def derive(cls, figures: dict[str, float]) -> dict[str, float]:
        out = dict(figures)
        if figures.get("extract_seconds"):
            out["tokens_per_s"] = round(figures.get("new_tokens", 0) / figures["extract_seconds"], 1)
        if figures.get("tokens"):
            out["bytes_per_token"] = round(figures.get("bytes", 0) / figures["tokens"], 1)
        return out
