"""A pipeline stage as one object: `Stage`, the base each stage package subclasses in its `stage.py`.

A stage's declaration (name, pool, timeout, upstream, what it reads for its fingerprint, what it may carry on from,
what it writes), its work (`run`), its summary type, its report section and its CLI command are attributes and
methods of one class, so go-to-definition follows every one of them and a rename breaks at import, not at run
time. The runner, the CLI, `status`, the report and the KFP pipeline all take the stage objects from the registry
(flashdraft/run/registry.py), which the core receives from the top layer: nothing in `flashdraft/` imports a stage.
Heavy imports stay inside the methods, so declaring the stages (which `flashdraft --help` does) stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from flashdraft.run.stage import Pool, StageSummary

if TYPE_CHECKING:
    import typer

    from flashdraft.config import RunConfig
    from flashdraft.run.reporting import RunView, StageReport
    from flashdraft.storage.store import ObjectStore


class Stage:
    """One pipeline stage, declared once. Read by the CLI (one command each), the runner (fingerprints: `reads`
    less `ignores`; reuse, `continue_on` or refuse), the KFP pipeline and placement (`pool`, `timeout_s`),
    `status` and the report (order, `summary`, `report`), and `--from` (`outputs`). docs/stages.md."""

    name: ClassVar[str]
    summary: ClassVar[type[StageSummary]] = StageSummary
    pool: ClassVar[Pool]
    timeout_s: ClassVar[int]  # the pod's activeDeadlineSeconds on a cluster
    doc: ClassVar[str] = ""  # one line: the CLI command's help and docs/stages.md
    per_shard: ClassVar[bool] = False  # one task per prompt shard (a ParallelFor on a cluster)
    # Makes training data or trains: an evaluate-only run (RunConfig.evaluate_only: a pretrained drafter with
    # training.max_steps 0) has no task of it, on a cluster or in run-local.
    trains: ClassVar[bool] = False
    # Makes the training data (prompts, responses, features): a run with data.features_from reads this stage's
    # committed results from its source run (`from_source`) and has no task of it.
    makes_features: ClassVar[bool] = False
    upstream: ClassVar[tuple[str, ...]] = ()  # stages whose committed results this one reads
    streaming_upstream: ClassVar[tuple[str, ...] | None] = None  # upstream in mode.kind=streaming, when it differs
    reads: ClassVar[tuple[str, ...]] = ()  # config sections or fields ("data", "eval.max_new_tokens") fingerprinted
    ignores: ClassVar[tuple[str, ...]] = ()  # fields under `reads` that cannot change the result (threads, queues)
    # Changes that make the stage run again and carry on from its committed work (more training steps, a new
    # checkpoint to evaluate): config paths (prefix match), upstream stage names, or "*" for any change.
    # Every other change of a committed result is refused (flashdraft/run/runner.py).
    continue_on: ClassVar[tuple[str, ...]] = ()
    streaming_continue_on: ClassVar[tuple[str, ...] | None] = None  # continue_on in streaming, when it differs
    outputs: ClassVar[tuple[str, ...]] = ()  # store prefixes/keys it writes besides metrics/ and status/ (--from)
    # The stage commits metrics/<task>.json itself (training: rank 0 of a torchrun or TrainJob whose launcher
    # holds the task); otherwise the runner commits the summary `run` returns.
    commits_result: ClassVar[bool] = False
    reuse: ClassVar[bool] = True  # False: runs every time (the plan gate, the report): cheap, never a cached answer
    has_command: ClassVar[bool] = True  # has a `flashdraft <name>` command
    # How a task meets the target (flashdraft/run/target_pin.py): "recheck" resolves target.revision again on every
    # start (the plan gate); "fetch" loads the pinned snapshot from the run's store (the first such task fetches it
    # from the Hub); "none": never loads it.
    target_use: ClassVar[str] = "none"
    # Runs once every other stage has ended, succeeded or failed (the report: the pipeline's exit handler): not a
    # row of the status table, and a stage added to the registry goes before it.
    exit_handler: ClassVar[bool] = False

    def run(self, cfg: RunConfig, shard: int | None = None) -> StageSummary | dict[str, Any]:
        """The stage's work for one task (`shard` for a per-shard stage, else None): its summary. The runner calls
        it (flashdraft/run/runner.py `run_task`), which owns reuse, continuation and the status record."""
        raise NotImplementedError(f"stage {self.name!r} has no run of its own (its callers pass the runner a body)")

    def command(self) -> Callable[..., None] | None:
        """Its `flashdraft <name>` typer command when it has options of its own; None: the generic command (run
        the stage through the runner, print its summary)."""
        return None

    def add_commands(self, app: typer.Typer) -> None:
        """Commands it adds besides `flashdraft <name>` (extract: `flashdraft features verify`)."""

    def report(self, summary: StageSummary | None, run: RunView) -> StageReport | None:
        """What the stage adds to the run report, given its committed summary (None when it left none)."""
        return None

    def tracked_files(self, store: ObjectStore) -> dict[str, bytes]:
        """Files of a finished task the experiment trackers keep as artifacts (name there -> bytes): the report,
        the model card. None by default."""
        return {}

    def shard_of(self, shard: int | None) -> int:
        """A per-shard stage's shard in `run` (the runner always passes one; a shard-less call is a bug)."""
        if shard is None:
            raise ValueError(f"stage {self.name!r} runs one shard at a time: pass the shard")
        return shard

    def skip_reason(self, cfg: RunConfig) -> str | None:
        """Why this run has no task of this stage, as the rest of a sentence (None: it has one). `trains` in an
        evaluate-only run; prep, generate and extract in a run reading data.features_from; a stage adds its own rule
        (generate: data.responses=dataset)."""
        if self.trains and cfg.evaluate_only:
            return ("this run evaluates a pretrained drafter as is (drafter.init=pretrained, training.max_steps=0) "
                    "and has no such task; set training.max_steps >= 1 to train on")
        if self.from_source(cfg):
            return (f"this run reads its {self.name} results in place from data.features_from "
                    f"({cfg.data.features_from}) and has no such task")
        return None

    def skipped_for(self, cfg: RunConfig) -> bool:
        """This run has no task of this stage (`skip_reason`): the DAG, run-local and the runner leave it out."""
        return self.skip_reason(cfg) is not None

    def ignores_for(self, cfg: RunConfig) -> tuple[str, ...]:
        """`ignores` for this run: a field can matter to a stage in one setting only (prep: the reply length
        limit with data.responses=dataset)."""
        return self.ignores

    def resolved_inputs(self, cfg: RunConfig) -> dict[str, Any]:
        """What the config names now, beside the config itself, that the result depends on (prep: each source's
        Hub commit or file digest): fingerprinted with the config's fields, so a source changed under the same
        name is not reused. Called only when the runner records or compares a fingerprint."""
        return {}

    def from_source(self, cfg: RunConfig) -> bool:
        """This run reads this stage's committed results from the data.features_from source run, in place."""
        return self.makes_features and cfg.data.features_from is not None

    def upstream_for(self, cfg: RunConfig) -> tuple[str, ...]:
        if cfg.mode.kind == "streaming" and self.streaming_upstream is not None:
            return self.streaming_upstream
        return self.upstream

    def continue_on_for(self, cfg: RunConfig) -> tuple[str, ...]:
        if cfg.mode.kind == "streaming" and self.streaming_continue_on is not None:
            return self.streaming_continue_on
        return self.continue_on

    def __repr__(self) -> str:
        return f"<stage {self.name}>"
