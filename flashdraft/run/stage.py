"""The base of a stage's typed summary (`StageSummary`: figures, headline) and what stage declarations share
(pools, timeouts, the planner's hints every stage ignores).

Each stage is one package, `components/<stage>/`: its logic, its CLI, its summary type and its `Stage` object
(flashdraft/run/contract.py) in `stage.py`. A summary module imports only this one, so it stays light.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from flashdraft.run.provenance import Provenance

Pool = Literal["cpu", "inference", "trainer"]
HOUR = 3600
# The planner's geometry hints (config `target.*`): the model's own config rules wherever it exists, so no stage
# result depends on them (every stage that reads `target` ignores them).
TARGET_HINTS = ("target.num_layers", "target.hidden_size", "target.vocab_size", "target.params",
                "target.active_params")


def numbers(mapping: dict[str, Any], sep: str = "_") -> dict[str, float]:
    """The numbers of a JSON object, top level and one level down (`drafter.tau` as `drafter_tau`, or with
    `sep="."` as `drafter.tau`): what a stage logs as KFP metrics and the report scans for throughputs. Booleans
    are not numbers here."""
    out: dict[str, float] = {}
    for key, value in mapping.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, leaf in items:
            if isinstance(leaf, int | float) and not isinstance(leaf, bool):
                out[f"{key}{sep}{sub}" if sub else key] = float(leaf)
    return out


class _FigureFormatter(string.Formatter):
    """str.format over a figures dict where a missing figure reads "-"."""

    def get_value(self, key: int | str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return kwargs.get(str(key))

    def format_field(self, value: Any, format_spec: str) -> str:
        return "-" if value is None else format(value, format_spec)


class StageSummary(BaseModel):
    """Common to every stage's summary."""

    model_config = ConfigDict(extra="allow")

    # Bulky fields left out of what a pipeline task hands to the next one (its KFP output parameter): they stay in
    # the stage's committed metrics. kfp.local passes the upstream output on the next task's command line, where
    # one argument may hold 128 KiB (a 2000-step training history was 500 KB: Errno 7, argument list too long).
    HANDOFF_EXCLUDE: ClassVar[frozenset[str]] = frozenset()

    skipped: bool = Field(False, description="the work was already committed: this is the stored summary")
    device: str | None = Field(None, description="where the stage's model work ran (cuda:0, cpu; training: rank 0's; "
                               "generate: the hf backend's, this attempt's); None for a stage without model work")
    store_io: dict[str, int] | None = Field(None, description="this attempt's store operations and retries "
                                            "(storage.store.io_counters)")

    def dump(self) -> dict[str, Any]:
        """The JSON object, with exactly the keys the stage set (defaults it did not set are left out)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def handoff(self) -> dict[str, Any]:
        """`dump()` without the bulky fields: what a pipeline task returns as its output parameter."""
        return self.model_dump(mode="json", exclude_unset=True, exclude=set(self.HANDOFF_EXCLUDE))

    def figures(self) -> dict[str, float]:
        """The numbers a stage's console line and the report's stage table show (status.StageRecord.figures).
        Counts and seconds are additive over shards (status.combine); rates come from them in `derive`."""
        return {}

    # The console/status line: (the figure that must exist, a str.format line over `headline_values`); a missing
    # figure reads "-". None: the stage has no headline.
    HEADLINE: ClassVar[tuple[str, str] | None] = None

    @classmethod
    def derive(cls, figures: dict[str, float]) -> dict[str, float]:
        """`figures` (summed over a fanned-out stage's shards) plus the rates computed from them."""
        return dict(figures)

    @classmethod
    def headline_values(cls, figures: dict[str, float]) -> dict[str, Any]:
        """What the HEADLINE line formats: the derived figures, plus any wording a stage adds."""
        return cls.derive(figures)

    def recorded_provenance(self) -> Provenance | None:
        """The software versions this stage recorded for the run (the export's), if it records them."""
        return None

    def status_detail(self) -> str:
        """Lines `flashdraft status` prints below its table for this stage ("" for none)."""
        return ""

    @classmethod
    def headline(cls, figures: dict[str, float]) -> str:
        """One line of the stage's key figures (empty without a HEADLINE or its required figure)."""
        if cls.HEADLINE is None:
            return ""
        required, line = cls.HEADLINE
        values = cls.headline_values(figures)
        return _FigureFormatter().vformat(line, (), values) if required in values else ""
