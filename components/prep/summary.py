"""The prep stage's summary (also stored in prompts/manifest.json)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from flashdraft.run.stage import StageSummary, numbers

# Where a run's training replies come from (data.responses), as prep's table, the report and the model card say.
RESPONSES_SOURCE = {
    "target": "written by the target itself (generate)",
    "dataset": "the dataset's own replies (data.responses=dataset, no generate task): the drafter learns replies the "
               "target did not write, so its tau on the target's own outputs may be lower than a target-trained one's"}


class TokenStats(BaseModel):
    """Token counts of the used prompts (no field set when no prompt was used)."""

    model_config = ConfigDict(extra="forbid")

    min: int | None = Field(None, description="fewest tokens")
    mean: float | None = Field(None, description="mean, to 0.1")
    p50: int | None = Field(None, description="median")
    p95: int | None = Field(None, description="95th percentile")
    max: int | None = Field(None, description="most tokens")
    total: int | None = Field(None, description="sum")


class PrepSummary(StageSummary):
    """components/prep/prep.py: prompts read, filtered, split into shards (also stored in prompts/manifest.json);
    built field by field, so an unknown key is an error."""

    model_config = ConfigDict(extra="forbid")

    HEADLINE: ClassVar[tuple[str, str] | None] = (
        "prompts_kept",
        "{prompts_kept:,.0f} prompts kept, {quarantined:,.0f} quarantined; used {prompts_train:,.0f} train, "
        "{prompts_eval:,.0f} eval")

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
    prompt_tokens: TokenStats | None = Field(None, description="token count statistics of the used prompts")
    sources: dict[str, dict[str, int]] | None = Field(None, description="per source: rows read, kept, rejected")
    tokenizer_sha: str | None = Field(None, description="tokenizer fingerprint")
    chat_template_sha: str | None = Field(None, description="chat template fingerprint")
    seed: int | None = Field(None, description="data.seed of the shuffle")
    seconds: float | None = Field(None, description="wall time")
    shard_keys: list[str] | None = Field(None, description="store keys of the train shards")
    eval_key: str | None = Field(None, description="store key of the held-out prompts")
    quarantine_key: str | None = Field(None, description="store key of the quarantine file")
    responses: str | None = Field(None, description="data.responses: target (generate writes the replies) or "
                                  "dataset (prep wrote the rows' own replies as the responses)")
    reply_tokens: int | None = Field(None, description="data.responses=dataset: reply tokens written as responses")
    markdown: str = Field("", description="the summary as a Markdown table")

    def figures(self) -> dict[str, float]:
        return numbers({"prompts_kept": self.kept, "prompts_train": self.num_train, "prompts_eval": self.num_eval,
                        "quarantined": self.quarantined, "duplicates": self.duplicates})
