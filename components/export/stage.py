"""The export stage: the trained drafter in the formats servers load (registered in components/stages.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flashdraft.components.export.summary import ExportSummary
from flashdraft.run.contract import Stage
from flashdraft.run.stage import HOUR, TARGET_HINTS
from flashdraft.storage.layout import STAGE_OUTPUTS

if TYPE_CHECKING:
    from flashdraft.config import RunConfig
    from flashdraft.run.reporting import RunView, StageReport
    from flashdraft.storage.store import ObjectStore


class Export(Stage):
    name = "export"
    summary = ExportSummary
    pool = "cpu"
    timeout_s = HOUR
    target_use = "fetch"
    # evaluate: the model card in every export folder carries the evaluation, so a new evaluation re-exports
    upstream = ("train", "evaluate")
    continue_on = ("*",)
    reads = ("target", "export", "drafter.init", "drafter.init_from")
    ignores = TARGET_HINTS
    doc = "Export the latest training checkpoint to the object store (export/) and a local folder."
    outputs = STAGE_OUTPUTS["export"]

    def run(self, cfg: RunConfig, shard: int | None = None) -> ExportSummary:
        from flashdraft.components.export.export import run_export

        return run_export(cfg)

    def command(self) -> Callable[..., None]:
        from flashdraft.components.export.cli import export

        return export

    def tracked_files(self, store: ObjectStore) -> dict[str, bytes]:
        """Each exported format's model card, for the experiment trackers (verified against its manifest)."""
        from flashdraft.components.export.card import CARD_FILE
        from flashdraft.components.export.export import exported_formats
        from flashdraft.storage.exports import read_export_file, read_manifest

        cards = {}
        for fmt in exported_formats(store):
            manifest = read_manifest(store, fmt)
            if manifest is not None and CARD_FILE in manifest.files:
                cards[f"model-card/{fmt}/{CARD_FILE}"] = read_export_file(store, fmt, CARD_FILE, manifest)
        return cards

    def report(self, summary: ExportSummary | None, run: RunView) -> StageReport:
        from flashdraft.components.export.report_section import report

        return report(summary, run)
