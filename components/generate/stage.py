"""The generate stage: target responses per prompt shard (registered in components/stages.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flashdraft.components.generate.summary import GenerateSummary
from flashdraft.run.contract import Stage
from flashdraft.run.stage import HOUR, TARGET_HINTS
from flashdraft.storage.layout import STAGE_OUTPUTS

if TYPE_CHECKING:
    from flashdraft.config import RunConfig


class Generate(Stage):
    name = "generate"
    summary = GenerateSummary
    makes_features = True
    pool = "inference"
    timeout_s = 24 * HOUR
    target_use = "fetch"
    per_shard = True
    trains = True
    upstream = ("prep",)
    doc = "Generate target responses for one prompt shard, committed chunk by chunk (resumable)."
    reads = ("target", "generation", "data.max_response_tokens", "data.chat_template_kwargs")
    ignores = (*TARGET_HINTS, "generation.data_parallel", "generation.enable_prefix_caching")
    outputs = STAGE_OUTPUTS["generate"]

    def skip_reason(self, cfg: RunConfig) -> str | None:
        """data.responses=dataset: prep writes the dataset's own replies as the responses; nothing to generate."""
        if cfg.data.responses == "dataset":
            return ("data.responses=dataset: prep writes the dataset's own replies as the responses and the run has "
                    "no such task; set data.responses=target to have the target write them")
        return super().skip_reason(cfg)

    def run(self, cfg: RunConfig, shard: int | None = None) -> GenerateSummary:
        from flashdraft.components.generate.generate import run_generate

        return run_generate(cfg, self.shard_of(shard))

    def command(self) -> Callable[..., None]:
        from flashdraft.components.generate.cli import generate

        return generate

