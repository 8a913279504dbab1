"""The export stage's summary (metrics/export.json)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from flashdraft.run.provenance import Provenance
from flashdraft.run.stage import StageSummary, numbers


class ExportedFormat(BaseModel):
    """One serving format the export wrote (`download_export` may later fill in only `local`)."""

    model_config = ConfigDict(extra="forbid")

    local: str | None = Field(None, description="the local folder it was written to (None: the store only)")
    store: str | None = Field(None, description="store URI of export/<format>/")
    manifest: str | None = Field(None, description="store URI of its manifest")
    bytes: dict[str, int] | None = Field(None, description="size of each file")


class ExportSummary(StageSummary):
    """components/export/export.py: metrics/export.json, built field by field (an unknown key is an error)."""

    model_config = ConfigDict(extra="forbid")

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
    formats: dict[str, ExportedFormat] | None = Field(None, description="per format: local folder, store URI, "
                                                      "manifest URI, sizes")
    provenance: Provenance | None = Field(None, description="flashdraft version and commit, library versions")

    def figures(self) -> dict[str, float]:
        return numbers({"step": self.step})

    def recorded_provenance(self) -> Provenance | None:
        return self.provenance
