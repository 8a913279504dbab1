"""What a stage contributes to the run report, and the formatting its sections share.

The report stage (components/report/) reads a finished or partial run into a `RunView` and asks every registered
stage for its `StageReport` (its stage object's `report`, flashdraft/run/contract.py): parts of the verdict line,
flags, sections, flat scalars (the KFP Metrics) and charts. The report itself holds no per-stage code; a new stage
reports by overriding `report` with a function of its own package.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flashdraft.run.status import NOT_RUN, StageStatus, stage_of

if TYPE_CHECKING:
    from flashdraft.run.provenance import Provenance
    from flashdraft.run.stage import StageSummary
    from flashdraft.storage.store import ObjectStore

# (title, rows of a table, the first row its header unless it is a two-column key/value table) or (title, a note)
Section = tuple[str, list[list[str]] | str]


@dataclass(frozen=True)
class Chart:
    """One PNG of the report: its alt text / caption and the image, base64."""

    title: str
    png_base64: str


@dataclass
class StageReport:
    """What one stage adds to the report; every part is optional."""

    verdict: list[str] = field(default_factory=list)  # parts of the first line ("tau ...", "lossless ...")
    lead: list[Section] = field(default_factory=list)  # right under the verdict (the plan's projection)
    flags: list[str] = field(default_factory=list)  # what a reader must not miss
    sections: list[Section] = field(default_factory=list)
    scalars: dict[str, float] = field(default_factory=dict)
    charts: dict[str, Chart] = field(default_factory=dict)


@dataclass
class RunView:
    """A run as the report reads it: committed metrics (typed per stage), stage states, the config it ran with."""

    run: str  # the run's store URL
    store: ObjectStore
    config: dict[str, Any] | None
    metrics: dict[str, dict[str, Any]]  # every metrics/<name>.json by name ("train", "extract-shard-00001")
    statuses: list[StageStatus]
    summaries: dict[str, StageSummary]  # the unsharded stages' metrics as their summary types
    target: str | None  # the target model id

    def summary(self, stage: str) -> Any:
        """`stage`'s typed summary, None when it left none."""
        return self.summaries.get(stage)

    def sharded(self, stage: str) -> list[dict[str, Any]]:
        """The metrics of every shard of a fanned-out stage (`extract-shard-00001`, ...)."""
        return [m for name, m in sorted(self.metrics.items()) if stage_of(name) == stage]

    def absent(self, stage: str) -> str:
        """The note of a section whose stage left no data: `train: not run`, or `train: failed (see Stages)`."""
        state = next((s.state for s in self.statuses if s.stage == stage), NOT_RUN)
        return f"{stage}: failed (see Stages)" if state == "failed" else f"{stage}: {state}"

    def provenance(self) -> tuple[Provenance | None, str]:
        """The software the run recorded (the first stage summary that carries one, the export's) and its source."""
        for stage, summary in self.summaries.items():
            if (found := summary.recorded_provenance()) is not None:
                return found, stage
        return None, "report"


def fmt(v: Any) -> str:
    """A table cell: "-" for None, thousands separators, at most 3 decimals."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return str(n)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (imported only when a report draws)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig: Any) -> str:
    """A figure as base64 PNG (closed afterwards)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode()
