"""The export stage's declaration (read by the registry, flashdraft/run/registry.py)."""

from flashdraft.components.export.summary import ExportSummary
from flashdraft.run.stage import HOUR, TARGET_HINTS, StageSpec

SPEC = StageSpec(
    "export", ExportSummary, "cpu", HOUR, run="flashdraft.components.export.export:run_export",
    # evaluate: the model card in every export folder carries the evaluation, so a new evaluation re-exports
    upstream=("train", "evaluate"), continue_on=("*",), reads=("target", "export", "drafter.init", "drafter.init_from"),
    ignores=TARGET_HINTS,
    doc="Export the latest training checkpoint to the object store (export/) and a local folder.",
    outputs=("export/",), report="flashdraft.components.export.report_section:report",
    cli="flashdraft.components.export.cli:export",
    component="flashdraft.pipelines.stages:export")
