"""The report stage's declaration (read by the registry, flashdraft/run/registry.py)."""

from flashdraft.components.report.summary import ReportSummary
from flashdraft.run.stage import StageSpec

SPEC = StageSpec(
    "report", ReportSummary, "cpu", 1800, reuse=False, doc="Render the run report.", exit_handler=True,
    outputs=("reports/",), cli="flashdraft.components.report.cli:report",
    component="flashdraft.pipelines.stages:report")
