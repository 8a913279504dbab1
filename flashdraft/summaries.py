"""Typed stage summaries: what each `run_<stage>` returns and commits as `metrics/<stage>.json`.

One model per stage, so the readers (the report, the local runner, the KFP metrics, the status records) use
attributes instead of probing dicts. The JSON a stage commits is built first and validated into its model, so the
stored content is unchanged: `dump()` gives back exactly the keys that were set. Models accept keys they do not
declare (`extra="allow"`) and every field has a default: metrics written by an older flashdraft (or a stage run by
hand with only some figures) still read, and a stage may add a figure without a reader breaking. `store_io`
(store operations and retries, in every stage's metrics file) is one such undeclared key.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from flashdraft.provenance import Provenance


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


class StageSummary(BaseModel):
    """Common to every stage's summary."""

    model_config = ConfigDict(extra="allow")

    # Bulky fields left out of what a pipeline task hands to the next one (its KFP output parameter): they stay in
    # the stage's committed metrics. kfp.local passes the upstream output on the next task's command line, where
    # one argument may hold 128 KiB (a 2000-step training history was 500 KB: Errno 7, argument list too long).
    HANDOFF_EXCLUDE: ClassVar[frozenset[str]] = frozenset()

    skipped: bool = Field(False, description="the work was already committed: this is the stored summary")

    def dump(self) -> dict[str, Any]:
        """The JSON object, with exactly the keys the stage set (defaults it did not set are left out)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def handoff(self) -> dict[str, Any]:
        """`dump()` without the bulky fields: what a pipeline task returns as its output parameter."""
        return self.model_dump(mode="json", exclude_unset=True, exclude=set(self.HANDOFF_EXCLUDE))

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

    target: str | None = Field(None, description="target model id")
    layer_ids: list[int] | None = Field(None, description="target layers whose hidden states are extracted")
    num_layers: int | None = Field(None, description="target decoder layers")
    hidden_size: int | None = Field(None, description="target hidden size")
    samples: int | None = Field(None, description="planned training samples")
    tokens_per_sample: float | None = Field(None, description="planned tokens per sample (prompt + response)")
    total_tokens: float | None = Field(None, description="samples x tokens_per_sample")
    bytes_per_token: int | None = Field(None, description="the naive bf16 layout's bytes per token (reference)")
    codecs: dict[str, CodecPlan] | None = Field(None, description="every codec's cost")
    codec: str | None = Field(None, description="the selected codec (features.codec)")
    total_bytes_at_rest: float | None = Field(None, description="offline: bytes stored at once with the selected codec")
    peak_bytes_streaming: int | None = Field(None, description="streaming: the window's peak bytes")
    objects: int | None = Field(None, description="objects the offline run stores")
    shards: int | None = Field(None, description="feature shards")
    tokens_to_generate: float | None = Field(None, description="response tokens the target generates")
    tokens_to_extract: float | None = Field(None, description="tokens extraction runs through the target")
    gpu_hours: dict[str, dict[str, Any]] | None = Field(None, description="per GPU stage: gpu, tokens, rate, GPU-hours")
    streaming_bandwidth_bytes_per_s: float | None = Field(None, description="streaming: store bandwidth needed")
    inference_per_trainer_gpu: float | None = Field(None, description="streaming: extract GPUs per trainer GPU")
    trainer_gpus: int | None = Field(None, description="training world size")
    mode: str | None = Field(None, description="mode.kind of the run")
    recommended_mode: str | None = Field(None, description="offline, streaming or 'none fits'")
    budget_bytes: int | None = Field(None, description="storage.budget_bytes")
    fits_budget: bool | None = Field(None, description="the offline data fits the budget")
    memory: dict[str, dict[str, Any]] | None = Field(
        None, description="per pool: peak_bytes_per_gpu, usable_bytes_per_gpu, fits, phase, parts, peak_source")
    train_flops_per_step: dict[str, float] | None = Field(None, description="one rank's step FLOPs by part")
    calibration: str | None = Field(None, description="where the calibration's measured figures come from")
    gate: str | None = Field(None, description="why the run may not start (storage or memory); None when it may")

    @property
    def selected(self) -> CodecPlan | None:
        """The selected codec's cost."""
        return (self.codecs or {}).get(self.codec or "")

    def figures(self) -> dict[str, float]:
        sel = self.selected
        return numbers({"planned_bytes_per_token": sel.bytes_per_token if sel else None,
                        "planned_total_bytes": sel.total_bytes if sel else None})


# -- prep ---------------------------------------------------------------------------------------------------


class PrepSummary(StageSummary):
    """components/prep/prep.py: prompts read, filtered, split into shards (also stored in prompts/manifest.json)."""

    num_shards: int | None = Field(None, description="generation shards (the pipeline's fan-out)")
    num_train: int | None = Field(None, description="train prompts")
    num_eval: int | None = Field(None, description="held-out prompts")
    shard_rows: list[int] | None = Field(None, description="prompts per shard")
    rows_read: int | None = Field(None, description="rows read from all sources")
    kept: int | None = Field(None, description="unique, valid rows within the length limit")
    duplicates: int | None = Field(None, description="exact duplicates removed")
    quarantined: int | None = Field(None, description="rejected rows (prompts/quarantine.jsonl)")
    bad_rows: dict[str, int] | None = Field(None, description="quarantined rows by reason")
    multi_turn: int | None = Field(None, description="prompts with more than one turn to regenerate")
    prompt_tokens: dict[str, Any] | None = Field(None, description="token count statistics of the used prompts")
    sources: dict[str, dict[str, Any]] | None = Field(None, description="per source: rows read, kept, rejected")
    tokenizer_sha: str | None = Field(None, description="tokenizer fingerprint")
    chat_template_sha: str | None = Field(None, description="chat template fingerprint")
    seed: int | None = Field(None, description="data.seed of the shuffle")
    seconds: float | None = Field(None, description="wall time")
    shard_keys: list[str] | None = Field(None, description="store keys of the train shards")
    eval_key: str | None = Field(None, description="store key of the held-out prompts")
    quarantine_key: str | None = Field(None, description="store key of the quarantine file")
    markdown: str = Field("", description="the summary as a Markdown table")

    def figures(self) -> dict[str, float]:
        return numbers({"prompts_kept": self.kept, "prompts_train": self.num_train, "prompts_eval": self.num_eval,
                        "quarantined": self.quarantined, "duplicates": self.duplicates})


# -- generate -----------------------------------------------------------------------------------------------


class GenerateSummary(StageSummary):
    """components/generate/generate.py: one shard's DONE record (responses/shard-K/DONE)."""

    shard: int | None = Field(None, description="generation shard")
    num_chunks: int | None = Field(None, description="response chunks of the shard")
    chunks_generated_now: int | None = Field(None, description="chunks this attempt generated (others were committed)")
    samples: int | None = Field(None, description="samples (prompts) generated")
    turns: int | None = Field(None, description="assistant turns generated")
    prompt_tokens: int | None = Field(None, description="prompt tokens")
    generated_tokens: int | None = Field(None, description="response tokens generated")
    empty: int | None = Field(None, description="empty responses")
    truncated: int | None = Field(None, description="responses cut at the length limit")
    generation_seconds: float | None = Field(None, description="generation time summed over chunks")
    tokens_per_s: float | None = Field(None, description="generated tokens per second")
    backend_startup_s: float | None = Field(None, description="backend load time of this attempt")
    backend: str | None = Field(None, description="generation.backend")
    device: str | None = Field(None, description="device the hf backend ran the target on (this attempt's)")
    fingerprint: str | None = Field(None, description="the task's fingerprint (flashdraft/runner.py), also in every "
                                    "chunk's commit record")

    def figures(self) -> dict[str, float]:
        return numbers({"samples": self.samples, "generated_tokens": self.generated_tokens,
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

    shard: int | None = Field(None, description="generation shard extracted")
    backend: str | None = Field(None, description="features.backend")
    device: str | None = Field(None, description="device the target ran on")
    codec: dict[str, Any] | None = Field(None, description="codec parameters")
    layer_ids: list[int] | None = Field(None, description="target layers extracted")
    samples: int | None = Field(None, description="samples stored")
    tokens: int | None = Field(None, description="tokens stored")
    bytes: int | None = Field(None, description="bytes stored")
    parts: list[PartStats] | None = Field(None, description="the shard's parts")
    skipped_empty_samples: int | None = Field(None, description="responses without tokens, not extracted")
    resumed_from_sample: int | None = Field(None, description="samples already committed before this attempt")
    new_tokens: int | None = Field(None, description="tokens this attempt extracted")
    elapsed_s: float | None = Field(None, description="this attempt's extraction time")
    tokens_per_s: float | None = Field(None, description="new_tokens / elapsed_s")
    bytes_per_token: float | None = Field(None, description="bytes / tokens")

    def figures(self) -> dict[str, float]:
        return numbers({"samples": self.samples, "tokens": self.tokens, "bytes": self.bytes,
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
    failed_listings: int = Field(0, description="samples of the window that failed past the store's retry budget "
                                 "(counted; the monitor carries on)")


class TrainSummary(StageSummary):
    """components/train/trainer.py: the trainer's summary (metrics/train.json)."""

    HANDOFF_EXCLUDE: ClassVar[frozenset[str]] = frozenset({"history", "heldout", "heldout_samples"})  # bulky

    steps: int | None = Field(None, description="optimizer steps done")
    tokens: int = Field(0, description="tokens trained on")
    tokens_per_s: float | None = Field(None, description="training tokens per second")
    final: FinalTrainStats | None = Field(None, description="last-10%-of-steps loss and accuracy")
    history: list[dict[str, Any]] = Field(default_factory=list, description="one entry per optimizer step")
    heldout: list[dict[str, Any]] = Field(
        default_factory=list, description="the held-out curve: {step, acc_by_pos, tau, blocks} every "
                                          "training.heldout_every steps (components/train/heldout.py)")
    streaming: StreamStats | None = Field(None, description="local streaming run: the window's figures")
    device: str | None = Field(None, description="rank 0's device (cuda:0, cpu)")
    resumed_from: int | None = Field(None, description="the checkpoint step this launch resumed from (a preempted "
                                     "or retried task, or training.preempt_after); None = trained from step 0")
    peak_memory_bytes: int | None = Field(None, description="rank 0's peak memory in this launch: CUDA peak "
                                          "allocated, or on a CPU the peak RSS (mapped head pages included)")

    def figures(self) -> dict[str, float]:
        final = self.final
        last = self.heldout[-1] if self.heldout else {}
        return numbers({"steps": self.steps, "final_loss": final.loss if final else None,
                        "slot1_accuracy": final.acc_by_pos[0] if final and final.acc_by_pos else None,
                        "tokens_per_s": self.tokens_per_s, "heldout_tau": last.get("tau"),
                        "heldout_slot1_accuracy": (last.get("acc_by_pos") or [None])[0]})


# -- evaluate -----------------------------------------------------------------------------------------------


class DecodeStats(BaseModel):
    """One decoder's figures over the held-out prompts (components/evaluate/spec.py summarize)."""

    model_config = ConfigDict(extra="allow")

    tau: float | None = Field(None, description="tokens per verification cycle (speculative decoders)")
    tokens_per_s: float | None = Field(None, description="decode throughput")
    speedup: float | None = Field(None, description="tokens_per_s over the target alone's")
    acceptance_per_position: list[float] | None = Field(None, description="fraction accepted per draft position")
    block_size: int | None = Field(None, description="the drafter's block size")
    prompts: int | None = Field(None, description="prompts this decoder ran (the baseline: eval.baseline_prompts)")


class LosslessCheck(BaseModel):
    model_config = ConfigDict(extra="allow")

    checked: bool = Field(description="greedy decoding, so the check ran")
    passed: bool = Field(description="speculative output equals the target's greedy output")
    prompts: int = Field(0, description="prompts compared")
    mismatches: list[dict[str, Any]] = Field(default_factory=list, description="divergences beyond ties")
    ties: list[dict[str, Any]] = Field(default_factory=list, description="divergences at numerical ties")
    tie_margin: float | None = Field(None, description="eval.lossless_tie_margin")


class PublishedFigure(BaseModel):
    """A published figure for the same suite (eval.reference; components/evaluate/reference.py)."""

    model_config = ConfigDict(extra="allow")

    label: str = Field(description="whose drafter, on which target")
    tau: float = Field(description="published acceptance length")
    speedup: float | None = Field(None, description="published speedup over the target alone")
    source: str | None = Field(None, description="where the figure comes from")
    thinking: bool | None = Field(None, description="thinking mode of the published run, when stated")
    target: str | None = Field(None, description="the target model of the published drafter")


class SuiteResult(BaseModel):
    """One row of the paper-layout table: one eval suite (components/evaluate/evaluate.py suite_row)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="suite name (eval.suites)")
    source: str | None = Field(None, description="heldout, humaneval or the URI")
    prompts: int | None = Field(None, description="prompts decoded")
    thinking: bool | None = Field(None, description="enable_thinking as rendered (None: the template's default)")
    max_new_tokens: int | None = Field(None, description="tokens decoded per prompt at most")
    tau: float | None = Field(None, description="the trained drafter's acceptance length")
    acceptance_per_position: list[float] | None = Field(None, description="fraction accepted per draft position")
    speedup: float | None = Field(None, description="speculative tokens/s over the target alone's, same prompts")
    target_tokens_per_s: float | None = Field(None, description="the target alone")
    drafter_tokens_per_s: float | None = Field(None, description="speculative decoding")
    lossless_passed: bool | None = Field(None, description="greedy outputs equal (None: sampling, not checked)")
    wall_seconds: float | None = Field(None, description="the suite's decoding wall time (all decoders, warm-up)")
    published: list[PublishedFigure] = Field(default_factory=list, description="published figures, same suite")


def same_model(a: str | None, b: str | None) -> bool:
    """Whether two model ids name the same model (`Qwen/Qwen3.6-27B` = `qwen3.6-27b`); an unstated one never does."""
    def name(m: str) -> str:
        return m.rstrip("/").rsplit("/", 1)[-1].lower()

    return bool(a and b) and name(a) == name(b)


SUITE_TABLE_HEADER = ["suite", "prompts", "thinking", "tau", "acceptance per position", "speedup vs target",
                      "published tau"]


class EvaluateSummary(StageSummary):
    """components/evaluate/evaluate.py: metrics/evaluate.json."""

    num_prompts: int | None = Field(None, description="held-out prompts decoded")
    max_new_tokens: int | None = Field(None, description="tokens decoded per prompt")
    temperature: float | None = Field(None, description="sampling temperature (0: greedy)")
    device: str | None = Field(None, description="device")
    threads: int | None = Field(None, description="torch threads")
    layer_ids: list[int] | None = Field(None, description="target layers the drafter reads")
    target: DecodeStats | None = Field(None, description="the target alone")
    drafter: DecodeStats | None = Field(None, description="the trained drafter")
    baseline: DecodeStats | None = Field(None, description="an untrained drafter of the same shape")
    lossless: LosslessCheck | None = Field(None, description="the lossless check")
    prompts: list[dict[str, Any]] = Field(default_factory=list, description="per-prompt figures")
    drafter_uri: str | None = Field(None, description="the evaluated checkpoint")
    baseline_init: str | None = Field(None, description="how the untrained baseline was initialised")
    host_cpus: int | None = Field(None, description="CPUs of the host (load makes CPU timings noisy)")
    host_load_1m: float | None = Field(None, description="the host's 1-minute load average after decoding")

    suites: list[SuiteResult] = Field(default_factory=list, description="one row per eval suite (paper layout)")

    def figures(self) -> dict[str, float]:
        """The headline (first suite) figures, and per suite `tau_<suite>`, `speedup_<suite>`,
        `acceptance_<k>_<suite>` (the KFP Metrics of the evaluate step and the status record)."""
        ll, drafter, target = self.lossless, self.drafter or DecodeStats(), self.target or DecodeStats()
        passed = (1.0 if ll.passed else 0.0) if ll and ll.checked else None
        out = numbers({"tau": drafter.tau, "baseline_tau": self.baseline.tau if self.baseline else None,
                       "target_tokens_per_s": target.tokens_per_s,
                       "speculative_tokens_per_s": drafter.tokens_per_s, "lossless_passed": passed})
        for s in self.suites:
            key = s.name.replace("-", "_").replace(".", "_")
            out.update(numbers({f"tau_{key}": s.tau, f"speedup_{key}": s.speedup}))
            out.update({f"acceptance_{k + 1}_{key}": float(a) for k, a in enumerate(s.acceptance_per_position or [])})
        return out

    def suite_table(self, target: str | None = None) -> list[list[str]]:
        """The paper-layout table (header first), one row per suite, as the report, `flashdraft status` and the
        evaluate log show it. With `target` (this run's), a published figure for another target is marked so."""
        def num(v: float | None, spec: str = ".2f") -> str:
            return "-" if v is None else format(v, spec)

        def whose(p: PublishedFigure) -> str:
            return "" if target is None or same_model(p.target, target) else " [another model's]"

        rows = [list(SUITE_TABLE_HEADER)]
        for s in self.suites:
            published = "; ".join(f"{p.tau:.2f}" + (f" ({p.speedup:.2f}x)" if p.speedup else "") + f" {p.label}"
                                  + whose(p) for p in s.published)
            rows.append([s.name, num(s.prompts, "d"), {True: "on", False: "off"}.get(s.thinking, "default"),
                         num(s.tau), " ".join(f"{a:.2f}" for a in s.acceptance_per_position or []) or "-",
                         "-" if s.speedup is None else f"{s.speedup:.2f}x", published or "-"])
        return rows

    def suite_table_text(self) -> str:
        """`suite_table` as aligned plain text (logs and terminals)."""
        rows = self.suite_table()
        if len(rows) == 1:
            return ""
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


# -- export -------------------------------------------------------------------------------------------------


class ExportSummary(StageSummary):
    """components/export/export.py: metrics/export.json."""

    checkpoint: str | None = Field(None, description="the exported checkpoint's store prefix")
    step: int | None = Field(None, description="its optimizer step")
    final: bool | None = Field(None, description="training had finished")
    dtype: str | None = Field(None, description="exported weight dtype")
    mask_token_id: int | None = Field(None, description="the drafter's mask token")
    trainable_mask: bool | None = Field(None, description="the mask embedding is trained")
    target_layer_ids: list[int] | None = Field(None, description="target layers the drafter reads")
    formats: dict[str, dict[str, Any]] | None = Field(None, description="per format: local folder, store URI, "
                                                      "manifest URI, sizes")
    provenance: Provenance | None = Field(None, description="flashdraft version and commit, library versions")

    def figures(self) -> dict[str, float]:
        return numbers({"step": self.step})


# -- pipeline-only tasks ------------------------------------------------------------------------------------


class StreamEndSummary(StageSummary):
    """pipelines/runtime.py end_stream: the streaming extract loop's end marker."""

    shards: int | None = Field(None, description="shards extracted")
    state: str | None = Field(None, description="the marker written (EOS)")


class ReportSummary(StageSummary):
    """components/report/report.py: where the report went and its flat scalars."""

    report_html: str | None = Field(None, description="store URI of report.html")
    summary_md: str | None = Field(None, description="store URI of summary.md")
    metrics: dict[str, float] = Field(default_factory=dict, description="flat scalars (the KFP Metrics)")
    stages: dict[str, str] = Field(default_factory=dict, description="each stage's state")
    html_path: str | None = Field(None, description="local copy of report.html (with out_dir)")
    markdown_path: str | None = Field(None, description="local copy of summary.md (with out_dir)")
    report_error: str | None = Field(None, description="why the report could not be rendered")


def summary_of(stage: str, value: StageSummary | dict[str, Any]) -> StageSummary:
    """`value` as `stage`'s model (its declared summary type, flashdraft/stages.py). A model passes through; a dict
    (a stored metrics file, a TrainJob's status, a stage run by hand) is validated here, the one place such dicts
    become typed."""
    if isinstance(value, StageSummary):
        return value
    from flashdraft.stages import stage as declared
    from flashdraft.stages import stage_names

    model = declared(stage).summary if stage in stage_names() else StageSummary
    return model.model_validate(value)
