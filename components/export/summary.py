"""The export stage's summary (metrics/export.json)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from flashdraft.run.provenance import Provenance
from flashdraft.run.stage import StageSummary, numbers


class ExportSummary(StageSummary):
    """components/export/export.py: metrics/export.json."""

    HEADLINE: ClassVar[tuple[str, str] | None] = (
        "step",
        "drafter of step {step:,.0f} exported")

    checkpoint: str | None = Field(None, description="the exported checkpoint's store prefix")
    step: int | None = Field(None, description="its optimizer step")
    final: bool | None = Field(None, description="training had finished")
    dtype: str | None = Field(None, description="exported weight dtype")
    mask_token_id: int | None = Field(None, description="the drafter's mask token")
    trainable_mask: bool | None = Field(None, description="the mask embedding is trained")
    target_layer_ids: list[int] | None = Field(None, description="target layers the drafter reads")
    formats: dict[str, dict[str, Any]] | None = Field(None, description="per format: local folder, store URI, "
                                                      "manifest URI, sizes")
    provenance: Provenance | None = Field(None, description="flashdraft version and commit, library versions")

    def figures(self) -> dict[str, float]:
        return numbers({"step": self.step})

    def recorded_provenance(self) -> Provenance | None:
        return self.provenance
