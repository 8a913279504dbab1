"""The report stage: the run report, the pipeline's exit handler (registered in components/stages.py). Its command
and the pipeline's exit task pass the runner a body of their own (options, the task's artifacts); its `run`
serves a sweep pipeline's variant runs, each reported as its tasks end (pipelines/pipeline.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flashdraft.components.report.summary import ReportSummary
from flashdraft.run.contract import Stage
from flashdraft.storage.layout import REPORT_HTML, REPORT_MARKDOWN, STAGE_OUTPUTS

if TYPE_CHECKING:
    import typer

    from flashdraft.config import RunConfig
    from flashdraft.storage.store import ObjectStore


class Report(Stage):
    name = "report"
    summary = ReportSummary
    pool = "cpu"
    timeout_s = 1800
    reuse = False
    exit_handler = True
    doc = "Render the run report."
    outputs = STAGE_OUTPUTS["report"]

    def run(self, cfg: RunConfig, shard: int | None = None) -> ReportSummary:
        """The run's report once its tasks have ended (a task still recorded running died: shown failed)."""
        from flashdraft.components.report.report import run_report

        return run_report(cfg, run_over=True)

    def tracked_files(self, store: ObjectStore) -> dict[str, bytes]:
        """The rendered report, for the experiment trackers."""
        return {f"report/{key.rsplit('/', 1)[-1]}": store.get_verified(key) for key in (REPORT_HTML, REPORT_MARKDOWN)
                if store.is_committed(key)}

    def command(self) -> Callable[..., None]:
        from flashdraft.components.report.cli import report

        return report

    def add_commands(self, app: typer.Typer) -> None:
        """`flashdraft compare`: runs side by side (components/report/compare.py)."""
        from flashdraft.components.report.cli import compare

        app.command("compare")(compare)
