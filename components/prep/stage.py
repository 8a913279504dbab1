"""The prep stage: prompts into shards (registered in components/stages.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flashdraft.components.prep.summary import PrepSummary
from flashdraft.run.contract import Stage
from flashdraft.run.stage import HOUR
from flashdraft.storage.layout import STAGE_OUTPUTS

if TYPE_CHECKING:
    from flashdraft.config import RunConfig
    from flashdraft.run.reporting import RunView, StageReport


# Prep's resolved input (Stage.resolved_inputs): not a config field, so named apart from them.
SOURCE_IDENTITIES = "data.sources@resolved"


class Prep(Stage):
    name = "prep"
    summary = PrepSummary
    makes_features = True
    pool = "cpu"
    timeout_s = 4 * HOUR
    target_use = "fetch"
    doc = ("Read, clean, dedupe, length-filter, shuffle and shard the prompts (quarantining bad rows); with "
           "data.responses=dataset also write the rows' own replies as the run's responses.")
    reads = ("data", "target.model", "target.source", "target.revision", "target.architecture",
             "target.trust_remote_code")
    # data.features_from: where a reader run takes this result from, not how it is made
    ignores = ("data.expected_tokens_per_sample", "data.expected_samples", "data.max_response_tokens",
               "data.features_from")
    outputs = STAGE_OUTPUTS["prep"]

    def ignores_for(self, cfg: RunConfig) -> tuple[str, ...]:
        """data.responses=dataset: the reply length limit decides which rows prep keeps."""
        if cfg.data.responses == "dataset":
            return tuple(i for i in self.ignores if i != "data.max_response_tokens")
        return self.ignores

    def resolved_inputs(self, cfg: RunConfig) -> dict[str, Any]:
        """Each source's commit (hf:) or sha256 (files) now: a dataset that moved or a file rewritten in place is
        a changed input, not "reused: fingerprint matches"."""
        from flashdraft.components.prep.sources import source_identity

        return {SOURCE_IDENTITIES: [source_identity(spec, cfg.storage) for spec in cfg.data.sources]}

    def run(self, cfg: RunConfig, shard: int | None = None) -> PrepSummary:
        from flashdraft.components.prep.prep import run_prep

        return run_prep(cfg)

    def command(self) -> Callable[..., None]:
        from flashdraft.components.prep.cli import prep

        return prep

    def report(self, summary: PrepSummary | None, run: RunView) -> StageReport:
        from flashdraft.components.prep.report_section import report

        return report(summary, run)
