"""The report stage: the run report, the pipeline's exit handler (registered in components/stages.py). It has no
`run` of its own: its callers (its command, the pipeline's exit task) pass the runner the body that renders it."""

from __future__ import annotations

from collections.abc import Callable

from flashdraft.components.report.summary import ReportSummary
from flashdraft.run.contract import Stage
from flashdraft.storage.layout import STAGE_OUTPUTS


class Report(Stage):
    name = "report"
    summary = ReportSummary
    pool = "cpu"
    timeout_s = 1800
    reuse = False
    exit_handler = True
    doc = "Render the run report."
    outputs = STAGE_OUTPUTS["report"]

    def command(self) -> Callable[..., None]:
        from flashdraft.components.report.cli import report

        return report
