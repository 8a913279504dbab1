"""Every pipeline stage, declared once.

A `StageSpec` says everything the rest of flashdraft needs to know about a stage: its name, the config it reads
(whole sections, so a field added to a section later is part of the stage's fingerprint without anyone
remembering it; `ignores` lists the fields that cannot change a result, such as thread counts), its summary type,
its node pool and pod timeout, the store prefixes it writes, the stages it reads from, and, referenced lazily by
"module:function" strings so that core `flashdraft/` never imports a stage, the function that does its work, its
CLI command (when it needs options of its own) and its KFP component body (when it needs a special signature).

Readers: the `flashdraft` CLI (one command per stage), the runner (flashdraft/runner.py: fingerprints, reuse,
continue or refuse), the KFP pipeline and its placement (pipelines/), `flashdraft status` and the report
(flashdraft/status.py), the run config's default stage -> pool table, and the docker tests. Adding a stage is its
logic, one `declare(StageSpec(...))` and its test; docs/stages.md walks through it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from flashdraft.summaries import (
    EvaluateSummary,
    ExportSummary,
    ExtractSummary,
    GenerateSummary,
    PlanSummary,
    PrepSummary,
    ReportSummary,
    StageSummary,
    StreamEndSummary,
    TrainSummary,
)

if TYPE_CHECKING:
    from flashdraft.config import RunConfig

Pool = Literal["cpu", "inference", "trainer"]
HOUR = 3600


def load_ref(ref: str) -> Any:
    """The object a "package.module:attribute" reference names (imported now, not when declared)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage. See the module docstring for who reads which field."""

    name: str
    summary: type[StageSummary]
    pool: Pool
    timeout_s: int  # the pod's activeDeadlineSeconds on a cluster
    run: str | None = None  # "module:function" called as f(cfg) or, per_shard, f(cfg, shard); returns `summary`
    doc: str = ""  # one line: the CLI command's help and docs/stages.md
    per_shard: bool = False  # one task per prompt shard (a ParallelFor on a cluster)
    upstream: tuple[str, ...] = ()  # stages whose committed results this one reads
    streaming_upstream: tuple[str, ...] | None = None  # upstream in mode.kind=streaming, when it differs
    reads: tuple[str, ...] = ()  # config sections or fields ("data", "eval.max_new_tokens") in the fingerprint
    ignores: tuple[str, ...] = ()  # fields under `reads` that cannot change the result (threads, queue depths)
    # Changes that make the stage run again and carry on from its committed work (more training steps, a new
    # checkpoint to evaluate): config paths (prefix match), upstream stage names, or "*" for any change.
    # Every other change of a committed result is refused (flashdraft/runner.py).
    continue_on: tuple[str, ...] = ()
    streaming_continue_on: tuple[str, ...] | None = None  # continue_on in mode.kind=streaming, when it differs
    outputs: tuple[str, ...] = ()  # store prefixes/keys it writes besides metrics/ and status/ (for --from)
    # The stage commits metrics/<task>.json itself (training: rank 0 of a torchrun or TrainJob whose launcher
    # holds the task); otherwise the runner commits the summary the run function returns.
    commits_result: bool = False
    reuse: bool = True  # False: runs every time (the plan gate, the report): cheap, and never a cached answer
    command: bool = True  # has a `flashdraft <name>` command
    cli: str | None = None  # "module:function": a typer command with options of its own; None: the generic one
    component: str | None = None  # "module:function": a KFP component body; None: the generic stage_task

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


_STAGES: dict[str, StageSpec] = {}


def declare(spec: StageSpec, *, after: str | None = None) -> StageSpec:
    """Add (or replace) a stage. `after`: its place in the display and pipeline order (default: before report)."""
    for name in spec.upstream + (spec.streaming_upstream or ()):
        if name not in _STAGES:
            raise ValueError(f"stage {spec.name!r}: upstream stage {name!r} is not declared")
    items = [(k, v) for k, v in _STAGES.items() if k != spec.name]
    anchor = after if after is not None else next((k for k, _ in reversed(items) if k != "report"), None)
    at = next((i + 1 for i, (k, _) in enumerate(items) if k == anchor), len(items))
    items.insert(at, (spec.name, spec))
    _STAGES.clear()
    _STAGES.update(items)
    return spec


def undeclare(name: str) -> None:
    """Remove a stage (tests that declare a toy stage clean up with this)."""
    _STAGES.pop(name, None)


def stage(name: str) -> StageSpec:
    try:
        return _STAGES[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(_STAGES)}") from None


def stages() -> list[StageSpec]:
    """Every declared stage, in pipeline order."""
    return list(_STAGES.values())


def stage_names() -> list[str]:
    return list(_STAGES)


def downstream(name: str) -> list[str]:
    """`name` and every stage that reads it, directly or not (in either mode), in pipeline order."""
    out = {name}
    for spec in stages():
        if set(spec.upstream + (spec.streaming_upstream or ())) & out:
            out.add(spec.name)
    return [s for s in _STAGES if s in out]


def default_pools() -> dict[str, Pool]:
    """pools.stage_pool's default: each stage's declared pool."""
    return {s.name: s.pool for s in stages() if s.command or s.reuse}


# -- the built-in stages ------------------------------------------------------------------------------------

_C = "flashdraft.components"
_TARGET_HINTS = ("target.num_layers", "target.hidden_size", "target.vocab_size", "target.params",
                 "target.active_params")  # planner geometry hints; the model's config rules

declare(StageSpec(
    "plan", PlanSummary, "cpu", 900, run=f"{_C}.plan.planner:run_plan", reuse=False,
    doc="Storage, GPU-hour and per-GPU memory plan; on a cluster the gate that refuses an over-budget run, a "
        "config whose predicted peak memory exceeds a pool's GPU, or changed settings.",
    reads=("target", "data", "features", "mode", "plan", "pools", "training", "storage.budget_bytes", "drafter",
           "generation.tensor_parallel", "generation.max_model_len"),
    cli=f"{_C}.plan.cli:plan", component="flashdraft.pipelines.stages:plan_gate"))
declare(StageSpec(
    "prep", PrepSummary, "cpu", 4 * HOUR, run=f"{_C}.prep.prep:run_prep",
    doc="Read, clean, dedupe, length-filter, shuffle and shard the prompts (quarantining bad rows).",
    reads=("data", "target.model", "target.source", "target.revision", "target.architecture",
           "target.trust_remote_code"),
    ignores=("data.expected_tokens_per_sample", "data.expected_samples", "data.max_response_tokens"),
    outputs=("prompts/",), cli=f"{_C}.prep.cli:prep", component="flashdraft.pipelines.stages:prep"))
declare(StageSpec(
    "generate", GenerateSummary, "inference", 24 * HOUR, run=f"{_C}.generate.generate:run_generate",
    per_shard=True, upstream=("prep",),
    doc="Generate target responses for one prompt shard, committed chunk by chunk (resumable).",
    reads=("target", "generation", "data.max_response_tokens", "data.chat_template_kwargs"),
    ignores=(*_TARGET_HINTS, "generation.data_parallel", "generation.enable_prefix_caching"),
    outputs=("responses/",), cli=f"{_C}.generate.cli:generate", component="flashdraft.pipelines.stages:generate"))
declare(StageSpec(
    "extract", ExtractSummary, "inference", 24 * HOUR, run=f"{_C}.extract.extract:run_extract",
    per_shard=True, upstream=("generate",),
    doc="Capture the target's DFlash-layer hidden states for one generation shard into committed feature shards.",
    reads=("target", "features"), ignores=("features.queue_depth",),
    outputs=("features/",), cli=f"{_C}.extract.cli:extract", component="flashdraft.pipelines.stages:extract"))
declare(StageSpec(
    "stream-end", StreamEndSummary, "cpu", 900, run="flashdraft.pipelines.runtime:end_stream", reuse=False,
    command=False, upstream=("extract",), doc="Streaming: tell the trainer the extract loop ended (EOS or FAILED).",
    component="flashdraft.pipelines.stages:stream_end"))
declare(StageSpec(
    "train", TrainSummary, "trainer", 7 * 24 * HOUR, run=f"{_C}.train.trainer:run_train",
    upstream=("extract",), streaming_upstream=("generate",),
    doc="Train the drafter on the run's feature shards (resumes from the latest checkpoint).",
    reads=("target", "features.layer_ids", "features.num_features", "drafter", "training", "mode"),
    ignores=(*_TARGET_HINTS, "training.num_threads", "training.feature_decode", "training.checkpoint_every",
             "training.preempt_after", "mode.window_bytes", "mode.window_shards"),
    # streaming: the consumed parts are gone, so there is nothing to train on from a finished stream
    continue_on=("training.max_steps", "training.epochs"), streaming_continue_on=(), commits_result=True,
    outputs=("checkpoints/", "metrics/stream.json"), cli=f"{_C}.train.cli:train",
    component="flashdraft.pipelines.stages:train"))
declare(StageSpec(
    "evaluate", EvaluateSummary, "inference", 6 * HOUR, run=f"{_C}.evaluate.evaluate:run_evaluate",
    upstream=("train",), continue_on=("*",),
    doc="Speculative decoding on every eval suite: tau, per-position acceptance, tokens/s, lossless check.",
    reads=("target", "eval", "features.layer_ids", "features.num_features", "data.chat_template_kwargs"),
    ignores=_TARGET_HINTS, cli=f"{_C}.evaluate.cli:evaluate", component="flashdraft.pipelines.stages:evaluate"))
declare(StageSpec(
    "export", ExportSummary, "cpu", HOUR, run=f"{_C}.export.export:run_export",
    # evaluate: the model card in every export folder carries the evaluation, so a new evaluation re-exports
    upstream=("train", "evaluate"), continue_on=("*",), reads=("target", "export"), ignores=_TARGET_HINTS,
    doc="Export the latest training checkpoint to the object store (export/) and a local folder.",
    outputs=("export/",), cli=f"{_C}.export.cli:export", component="flashdraft.pipelines.stages:export"))
declare(StageSpec(
    "report", ReportSummary, "cpu", 1800, reuse=False, doc="Render the run report.",
    outputs=("reports/",), cli=f"{_C}.report.cli:report", component="flashdraft.pipelines.stages:report"))
