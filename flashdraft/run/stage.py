"""The contract of a pipeline stage: its declaration (`StageSpec`) and the base of its typed summary.

Each stage is one package, `components/<stage>/`: its logic, its CLI, its summary type (figures, headline) and its
declaration, `components/<stage>/stage.py`'s `SPEC`. The registry (flashdraft/run/registry.py) builds the list of
stages from lazy references, so this core module, like all of `flashdraft/`, imports no stage.
"""

from __future__ import annotations

import importlib
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from flashdraft.config import RunConfig
    from flashdraft.run.provenance import Provenance

Pool = Literal["cpu", "inference", "trainer"]
HOUR = 3600
# The planner's geometry hints (config `target.*`): the model's own config rules wherever it exists, so no stage
# result depends on them (every stage that reads `target` ignores them).
TARGET_HINTS = ("target.num_layers", "target.hidden_size", "target.vocab_size", "target.params",
                "target.active_params")


def load_ref(ref: str) -> Any:
    """The object a "package.module:attribute" reference names (imported now, not when declared)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


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


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage, declared once. Read by the CLI (one command each), the runner (fingerprints: `reads`
    less `ignores`; reuse, `continue_on` or refuse), the KFP pipeline and placement (`pool`, `timeout_s`,
    `component`), `status` and the report (order, `summary`), and `--from` (`outputs`). docs/stages.md."""

    name: str
    summary: type[StageSummary]
    pool: Pool
    timeout_s: int  # the pod's activeDeadlineSeconds on a cluster
    run: str | None = None  # "module:function" called as f(cfg) or, per_shard, f(cfg, shard); returns `summary`
    doc: str = ""  # one line: the CLI command's help and docs/stages.md
    per_shard: bool = False  # one task per prompt shard (a ParallelFor on a cluster)
    # Makes training data or trains: an evaluate-only run (RunConfig.evaluate_only: a pretrained drafter with
    # training.max_steps 0) has no task of it, on a cluster or in run-local.
    trains: bool = False
    upstream: tuple[str, ...] = ()  # stages whose committed results this one reads
    streaming_upstream: tuple[str, ...] | None = None  # upstream in mode.kind=streaming, when it differs
    reads: tuple[str, ...] = ()  # config sections or fields ("data", "eval.max_new_tokens") in the fingerprint
    ignores: tuple[str, ...] = ()  # fields under `reads` that cannot change the result (threads, queue depths)
    # Changes that make the stage run again and carry on from its committed work (more training steps, a new
    # checkpoint to evaluate): config paths (prefix match), upstream stage names, or "*" for any change.
    # Every other change of a committed result is refused (flashdraft/run/runner.py).
    continue_on: tuple[str, ...] = ()
    streaming_continue_on: tuple[str, ...] | None = None  # continue_on in mode.kind=streaming, when it differs
    outputs: tuple[str, ...] = ()  # store prefixes/keys it writes besides metrics/ and status/ (for --from)
    # The stage commits metrics/<task>.json itself (training: rank 0 of a torchrun or TrainJob whose launcher
    # holds the task); otherwise the runner commits the summary the run function returns.
    commits_result: bool = False
    reuse: bool = True  # False: runs every time (the plan gate, the report): cheap, and never a cached answer
    command: bool = True  # has a `flashdraft <name>` command
    cli: str | None = None  # "module:function": a typer command with options of its own; None: the generic one
    # "module:function" called as f(summary or None, run: reporting.RunView) -> reporting.StageReport: what the
    # stage adds to the run report, given its committed summary (None when it left none); None: nothing. A
    # reference, so this contract needs nothing of the report's types (reporting.py reads summaries of this one).
    report: str | None = None
    component: str | None = None  # "module:function": a KFP component body; None: the generic stage_task
    # Runs once every other stage has ended, succeeded or failed (the report: the pipeline's exit handler): not a
    # row of the status table, and a stage added to the registry goes before it.
    exit_handler: bool = False

    def skipped_for(self, cfg: RunConfig) -> bool:
        """This run has no task of this stage (`trains` in an evaluate-only run)."""
        return self.trains and cfg.evaluate_only

    def upstream_for(self, cfg: RunConfig) -> tuple[str, ...]:
        if cfg.mode.kind == "streaming" and self.streaming_upstream is not None:
            return self.streaming_upstream
        return self.upstream

    def continue_on_for(self, cfg: RunConfig) -> tuple[str, ...]:
        if cfg.mode.kind == "streaming" and self.streaming_continue_on is not None:
            return self.streaming_continue_on
        return self.continue_on

    def run_function(self) -> Callable[..., Any]:
        if self.run is None:
            raise ValueError(f"stage {self.name!r} declares no run function")
        return load_ref(self.run)
