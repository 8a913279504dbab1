"""The extract stage: the target's hidden states per generation shard (registered in components/stages.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flashdraft.components.extract.summary import ExtractSummary
from flashdraft.run.contract import Stage
from flashdraft.run.stage import HOUR
from flashdraft.storage.layout import STAGE_OUTPUTS

if TYPE_CHECKING:
    import typer

    from flashdraft.config import RunConfig
    from flashdraft.run.reporting import RunView, StageReport


class Extract(Stage):
    name = "extract"
    summary = ExtractSummary
    makes_features = True
    pool = "inference"
    timeout_s = 24 * HOUR
    target_use = "fetch"
    per_shard = True
    trains = True
    upstream = ("generate",)
    doc = "Capture the target's DFlash-layer hidden states for one generation shard into committed feature shards."
    reads = ("target", "features")
    ignores = ("features.queue_depth",)
    outputs = STAGE_OUTPUTS["extract"]

    def run(self, cfg: RunConfig, shard: int | None = None) -> ExtractSummary:
        from flashdraft.components.extract.extract import run_extract

        return run_extract(cfg, self.shard_of(shard))

    def command(self) -> Callable[..., None]:
        from flashdraft.components.extract.cli import extract

        return extract

    def add_commands(self, app: typer.Typer) -> None:
        """`flashdraft features verify`: the stored features against a fresh forward of the target."""
        from flashdraft.components.extract.cli import register_features

        register_features(app)

    def report(self, summary: ExtractSummary | None, run: RunView) -> StageReport:
        from flashdraft.components.extract.report_section import report

        return report(summary, run)
