"""The base of every config section: unknown fields are refused, assignments are validated."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
