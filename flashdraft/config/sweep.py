"""A sweep: one base config and its variants, each a set of `--set` overrides (`flashdraft sweep`, the sweep
pipeline's `variants` parameter; docs/training.md).

The base run makes the prompts, responses and features once; each variant is its own run (run_id
`<base>-<variant>`) that reads them through `data.features_from`, so a variant may change training, drafter,
evaluation and export settings, never what the features depend on (the runner refuses that, naming the field).
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,40}$")


class Variant(BaseModel):
    """One variant: its name (the run_id suffix) and its overrides (dotted field -> value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the variant's name: its run is `<base run_id>-<name>`")
    overrides: dict[str, Any] = Field(default_factory=dict, description="dotted config field -> value, as --set")

    @model_validator(mode="after")
    def _check(self) -> Variant:
        if not _NAME.match(self.name):
            raise ValueError(f"variant name {self.name!r}: letters, digits, '.', '_' and '-', at most 41, starting "
                             "with a letter or digit (it ends the variant's run_id)")
        bad = [k for k in self.overrides if k in ("run_id", "data.features_from") or k.startswith("storage.")]
        if bad:
            raise ValueError(f"variant {self.name!r} sets {bad}: the sweep sets a variant's run_id, source and store")
        return self


class SweepSpec(BaseModel):
    """A sweep file: `variants` (a list of named override sets) or `grid` (field -> values: every combination),
    or both (the list first)."""

    model_config = ConfigDict(extra="forbid")

    variants: list[Variant] = Field(default_factory=list, description="named variants")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="field -> values; one variant per "
                                       "combination, named after its values")

    def expand(self) -> list[Variant]:
        """Every variant, the listed ones then the grid's; names unique."""
        out = list(self.variants)
        fields = list(self.grid)
        for values in itertools.product(*(self.grid[f] for f in fields)) if fields else ():
            name = "-".join(f"{f.rsplit('.', 1)[-1]}{_slug(v)}" for f, v in zip(fields, values, strict=True))
            out.append(Variant(name=name, overrides=dict(zip(fields, values, strict=True))))
        names = [v.name for v in out]
        if not out:
            raise ValueError("a sweep needs at least one variant (`variants` or `grid`)")
        if len(set(names)) != len(names):
            raise ValueError(f"variant names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
        return out


def _slug(value: Any) -> str:
    """A value as a run_id piece: `1e-4` -> `1e-4`, `dflash2` -> `dflash2`, other characters -> `_`."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(value))
