"""Typed stage summaries: what each `run_<stage>` returns and commits as `metrics/<stage>.json`.

One model per stage, so the readers (the report, the local runner, the KFP metrics, the status records) use
attributes instead of probing dicts. The JSON a stage commits is built first and validated into its model, so the
stored content is unchanged: `dump()` gives back exactly the keys that were set. Models accept keys they do not
declare (`extra="allow"`): metrics written by an older flashdraft still read, and a stage may add a figure
without a reader breaking. `store_io` (store operations and retries, in every stage's metrics file) is one such.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def numbers(mapping: dict[str, Any]) -> dict[str, float]:
    """The numbers of a JSON object, top level and one level down (`drafter.tau` as `drafter_tau`): what a stage
    logs as KFP metrics and the report scans for throughputs. Booleans are not numbers here."""
    out: dict[str, float] = {}
    for key, value in mapping.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, leaf in items:
            if isinstance(leaf, int | float) and not isinstance(leaf, bool):
                out[f"{key}_{sub}" if sub else key] = float(leaf)
    return out


def _figures(picks: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in picks.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class StageSummary(BaseModel):
    """Common to every stage's summary."""

    model_config = ConfigDict(extra="allow")

    skipped: bool = Field(False, description="the work was already committed: this is the stored summary")

    def dump(self) -> dict[str, Any]:
        """The JSON object, with exactly the keys the stage set (defaults it did not set are left out)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def figures(self) -> dict[str, float]:
        """The numbers a stage's console line and the report's stage table show (status.StageRecord.figures).
        Counts and seconds are additive over shards (status.combine); rates come from them in status.derive."""
        return {}


# -- plan ---------------------------------------------------------------------------------------------------


class CodecPlan(BaseModel):
    model_config = ConfigDict(extra="allow")

    lossless: bool = Field(description="the codec reproduces bf16 features exactly")
    bytes_per_token: float = Field(description="stored bytes per token, all feature layers")
    total_bytes: float = Field(description="bytes at rest for the whole run with this codec")


class PlanSummary(StageSummary):
    """components/plan/planner.py: storage and GPU-hour plan, and the offline budget gate."""

    target: str = Field(description="target model id")
    layer_ids: list[int] = Field(description="target layers whose hidden states are extracted")
    num_layers: int = Field(description="target decoder layers")
    hidden_size: int = Field(description="target hidden size")
    samples: int = Field(description="planned training samples")
    tokens_per_sample: float = Field(description="planned tokens per sample (prompt + response)")
    total_tokens: float = Field(description="samples x tokens_per_sample")
    bytes_per_token: int = Field(description="the naive bf16 layout's bytes per token (reference)")
    codecs: dict[str, CodecPlan] = Field(description="every codec's cost")
    codec: str = Field(description="the selected codec (features.codec)")
    total_bytes_at_rest: float = Field(description="offline: bytes stored at once with the selected codec")
    peak_bytes_streaming: int = Field(description="streaming: the window's peak bytes")
    objects: int = Field(description="objects the offline run stores")
    shards: int = Field(description="feature shards")
    tokens_to_generate: float = Field(description="response tokens the target generates")
    tokens_to_extract: float = Field(description="tokens extraction runs through the target")
    gpu_hours: dict[str, dict[str, Any]] = Field(description="per GPU stage: gpu, tokens, rate, GPU-hours")
    streaming_bandwidth_bytes_per_s: float | None = Field(description="streaming: store bandwidth needed")
    inference_per_trainer_gpu: float | None = Field(description="streaming: extract GPUs per trainer GPU")
    trainer_gpus: int = Field(description="training world size")
    mode: str = Field(description="mode.kind of the run")
    recommended_mode: str = Field(description="offline, streaming or 'none fits'")
    budget_bytes: int | None = Field(description="storage.budget_bytes")
    fits_budget: bool = Field(description="the offline data fits the budget")
    gate: str | None = Field(None, description="why an offline run may not start; None when it may")

    @property
    def selected(self) -> CodecPlan:
        return self.codecs[self.codec]

    def figures(self) -> dict[str, float]:
        return _figures({"planned_bytes_per_token": self.selected.bytes_per_token,
                         "planned_total_bytes": self.selected.total_bytes})


# -- prep ---------------------------------------------------------------------------------------------------


class PrepSummary(StageSummary):
    """components/prep/prep.py: prompts read, filtered, split into shards (also stored in prompts/manifest.json)."""

    num_shards: int = Field(description="generation shards (the pipeline's fan-out)")
    num_train: int = Field(description="train prompts")
    num_eval: int = Field(description="held-out prompts")
    shard_rows: list[int] = Field(description="prompts per shard")
    rows_read: int = Field(description="rows read from all sources")
    kept: int = Field(description="unique, valid rows within the length limit")
    duplicates: int = Field(description="exact duplicates removed")
    quarantined: int = Field(description="rejected rows (prompts/quarantine.jsonl)")
    bad_rows: dict[str, int] = Field(description="quarantined rows by reason")
    multi_turn: int = Field(description="prompts with more than one turn to regenerate")
    prompt_tokens: dict[str, Any] = Field(description="token count statistics of the used prompts")
    sources: dict[str, dict[str, Any]] = Field(description="per source: rows read, kept, rejected by reason")
    tokenizer_sha: str = Field(description="tokenizer fingerprint")
    chat_template_sha: str = Field(description="chat template fingerprint")
    seed: int = Field(description="data.seed of the shuffle")
    seconds: float = Field(description="wall time")
    shard_keys: list[str] = Field(description="store keys of the train shards")
    eval_key: str = Field(description="store key of the held-out prompts")
    quarantine_key: str = Field(description="store key of the quarantine file")
    markdown: str = Field("", description="the summary as a Markdown table")

    def figures(self) -> dict[str, float]:
        return _figures({"prompts_kept": self.kept, "prompts_train": self.num_train, "prompts_eval": self.num_eval,
                         "quarantined": self.quarantined, "duplicates": self.duplicates})


# -- generate -----------------------------------------------------------------------------------------------


class GenerateSummary(StageSummary):
    """components/generate/generate.py: one shard's DONE record (responses/shard-K/DONE)."""

    shard: int = Field(description="generation shard")
    num_chunks: int = Field(description="response chunks of the shard")
    chunks_generated_now: int = Field(description="chunks this attempt generated (the rest were committed)")
    samples: int = Field(description="samples (prompts) generated")
    turns: int = Field(description="assistant turns generated")
    prompt_tokens: int = Field(description="prompt tokens")
    generated_tokens: int = Field(description="response tokens generated")
    empty: int = Field(description="empty responses")
    truncated: int = Field(description="responses cut at the length limit")
    generation_seconds: float = Field(description="generation time summed over chunks")
    tokens_per_s: float = Field(description="generated tokens per second")
    backend_startup_s: float = Field(description="backend load time of this attempt")
    backend: str = Field(description="generation.backend")
    fingerprint: dict[str, Any] = Field(description="what the responses depend on (drift check on resume)")

    def figures(self) -> dict[str, float]:
        return _figures({"samples": self.samples, "generated_tokens": self.generated_tokens,
                         "generation_seconds": self.generation_seconds})


# -- extract ------------------------------------------------------------------------------------------------


class PartStats(BaseModel):
    """One committed feature part (from its commit record, or a streamed part's tombstone)."""

    model_config = ConfigDict(extra="allow")

    key: str = Field(description="store key of the part")
    samples: int | None = Field(description="samples in the part")
    tokens: int | None = Field(description="tokens in the part")
    bytes: int = Field(description="stored size")
    sha256: str = Field(description="content checksum")


class ExtractSummary(StageSummary):
    """components/extract/extract.py: one shard's DONE record (features/shard-K/DONE)."""

    shard: int = Field(description="generation shard extracted")
    backend: str = Field(description="features.backend")
    device: str = Field(description="device the target ran on")
    codec: dict[str, Any] = Field(description="codec parameters")
    layer_ids: list[int] = Field(description="target layers extracted")
    samples: int = Field(description="samples stored")
    tokens: int = Field(description="tokens stored")
    bytes: int = Field(description="bytes stored")
    parts: list[PartStats] = Field(description="the shard's parts")
    skipped_empty_samples: int = Field(description="responses without tokens, not extracted")
    resumed_from_sample: int = Field(description="samples already committed before this attempt")
    new_tokens: int = Field(description="tokens this attempt extracted")
    elapsed_s: float = Field(description="this attempt's extraction time")
    tokens_per_s: float | None = Field(description="new_tokens / elapsed_s")
    bytes_per_token: float = Field(description="bytes / tokens")

    def figures(self) -> dict[str, float]:
        return _figures({"samples": self.samples, "tokens": self.tokens, "bytes": self.bytes,
                         "new_tokens": self.new_tokens, "extract_seconds": self.elapsed_s})


# -- train --------------------------------------------------------------------------------------------------


class FinalTrainStats(BaseModel):
    model_config = ConfigDict(extra="allow")

    loss: float = Field(description="mean loss over the last 10% of steps")
    acc_by_pos: list[float] = Field(description="mean accuracy per block position over the last 10% of steps")


class StreamStats(BaseModel):
    """pipelines/runtime.py's window monitor in a local streaming run (metrics/stream.json)."""

    model_config = ConfigDict(extra="allow")

    produced_bytes: int = Field(description="bytes of every part ever produced")
    produced_parts: int = Field(description="parts ever produced")
    peak_stored_bytes: int = Field(description="most bytes held in the window at once")
    peak_stored_parts: int = Field(description="most parts held at once")
    window_bytes: int = Field(description="mode.window_bytes")
    window_shards: int = Field(description="mode.window_shards")
    reuse: int = Field(description="mode.reuse")
    stopped_early: bool = Field(description="the trainer finished before the producers")


class TrainSummary(StageSummary):
    """components/train/trainer.py: the trainer's summary (metrics/train.json)."""

    steps: int = Field(description="optimizer steps done")
    tokens: int = Field(0, description="tokens trained on")
    tokens_per_s: float | None = Field(None, description="training tokens per second")
    final: FinalTrainStats | None = Field(None, description="last-10%-of-steps loss and accuracy")
    history: list[dict[str, Any]] = Field(default_factory=list, description="one entry per optimizer step")
    streaming: StreamStats | None = Field(None, description="local streaming run: the window's figures")

    def figures(self) -> dict[str, float]:
        final = self.final
        return _figures({"steps": self.steps, "final_loss": final.loss if final else None,
                         "slot1_accuracy": final.acc_by_pos[0] if final and final.acc_by_pos else None,
                         "tokens_per_s": self.tokens_per_s})


# -- evaluate -----------------------------------------------------------------------------------------------


class DecodeStats(BaseModel):
    """One decoder's figures over the held-out prompts (components/evaluate/spec.py summarize)."""

    model_config = ConfigDict(extra="allow")

    tau: float | None = Field(None, description="tokens per verification cycle (speculative decoders)")
    tokens_per_s: float | None = Field(None, description="decode throughput")
    speedup: float | None = Field(None, description="tokens_per_s over the target alone's")
    acceptance_per_position: list[float] | None = Field(None, description="fraction accepted per draft position")
    block_size: int | None = Field(None, description="the drafter's block size")


class LosslessCheck(BaseModel):
    model_config = ConfigDict(extra="allow")

    checked: bool = Field(description="greedy decoding, so the check ran")
    passed: bool = Field(description="speculative output equals the target's greedy output")
    prompts: int = Field(0, description="prompts compared")
    mismatches: list[dict[str, Any]] = Field(default_factory=list, description="divergences beyond ties")
    ties: list[dict[str, Any]] = Field(default_factory=list, description="divergences at numerical ties")
    tie_margin: float | None = Field(None, description="eval.lossless_tie_margin")


class EvaluateSummary(StageSummary):
    """components/evaluate/evaluate.py: metrics/evaluate.json."""

    num_prompts: int = Field(description="held-out prompts decoded")
    max_new_tokens: int = Field(description="tokens decoded per prompt")
    temperature: float = Field(description="sampling temperature (0: greedy)")
    device: str = Field(description="device")
    threads: int = Field(description="torch threads")
    layer_ids: list[int] = Field(description="target layers the drafter reads")
    target: DecodeStats = Field(description="the target alone")
    drafter: DecodeStats = Field(description="the trained drafter")
    baseline: DecodeStats | None = Field(None, description="an untrained drafter of the same shape")
    lossless: LosslessCheck = Field(description="the lossless check")
    prompts: list[dict[str, Any]] = Field(default_factory=list, description="per-prompt figures")

    def figures(self) -> dict[str, float]:
        passed = (1.0 if self.lossless.passed else 0.0) if self.lossless.checked else None
        return _figures({"tau": self.drafter.tau, "baseline_tau": self.baseline.tau if self.baseline else None,
                         "target_tokens_per_s": self.target.tokens_per_s,
                         "speculative_tokens_per_s": self.drafter.tokens_per_s, "lossless_passed": passed})


# -- export -------------------------------------------------------------------------------------------------


class ExportSummary(StageSummary):
    """components/export/export.py: metrics/export.json."""

    checkpoint: str = Field(description="the exported checkpoint's store prefix")
    step: int = Field(description="its optimizer step")
    final: bool = Field(description="training had finished")
    dtype: str = Field(description="exported weight dtype")
    mask_token_id: int | None = Field(description="the drafter's mask token")
    trainable_mask: bool = Field(description="the mask embedding is trained")
    target_layer_ids: list[int] = Field(description="target layers the drafter reads")
    formats: dict[str, dict[str, Any]] = Field(description="per format: local folder, store URI, file sizes")

    def figures(self) -> dict[str, float]:
        return _figures({"step": self.step})


# -- pipeline-only tasks ------------------------------------------------------------------------------------


class StreamEndSummary(StageSummary):
    """pipelines/runtime.py end_stream: the streaming extract loop's end marker."""

    shards: int = Field(description="shards extracted")
    state: str = Field(description="the marker written (EOS)")


class ReportSummary(StageSummary):
    """components/report/report.py: where the report went and its flat scalars."""

    report_html: str | None = Field(None, description="store URI of report.html")
    summary_md: str | None = Field(None, description="store URI of summary.md")
    metrics: dict[str, float] = Field(default_factory=dict, description="flat scalars (the KFP Metrics)")
    stages: dict[str, str] = Field(default_factory=dict, description="each stage's state")
    html_path: str | None = Field(None, description="local copy of report.html (with out_dir)")
    markdown_path: str | None = Field(None, description="local copy of summary.md (with out_dir)")
    report_error: str | None = Field(None, description="why the report could not be rendered")


SUMMARIES: dict[str, type[StageSummary]] = {
    "plan": PlanSummary, "prep": PrepSummary, "generate": GenerateSummary, "extract": ExtractSummary,
    "train": TrainSummary, "evaluate": EvaluateSummary, "export": ExportSummary,
}
