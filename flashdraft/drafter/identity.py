"""The identity of a pretrained drafter a run started from (drafter.init=pretrained): made by pretrained.py when it
reads the weights, recorded by the train and evaluate summaries. Its own small module (pydantic only) so a summary
can name it without importing the drafter's loaders."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ParentIdentity(BaseModel):
    """The pretrained drafter a run started from (drafter.init=pretrained; flashdraft/drafter/pretrained.py): what
    the train and evaluate summaries record and the report and the model card name."""

    model_config = ConfigDict(frozen=True)

    source: str = Field(description="drafter.init_from as given")
    format: str = Field(description="flashdraft | zlab | speculators")
    revision: str | None = Field(None, description="the Hub commit the cache resolved (hf:), else None")
    sha256: str = Field(description="of the weights file (model.safetensors)")

    def line(self) -> str:
        rev = f" @ {self.revision[:12]}" if self.revision else ""
        return f"{self.source}{rev} ({self.format}, weights sha256 {self.sha256[:12]})"
