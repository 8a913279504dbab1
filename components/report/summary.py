"""The report stage's summary: where the report went and its flat scalars."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from flashdraft.run.stage import StageSummary


class ReportSummary(StageSummary):
    """components/report/report.py: where the report went and its flat scalars; built field by field, so an
    unknown key is an error."""

    model_config = ConfigDict(extra="forbid")

    report_html: str | None = Field(None, description="store URI of report.html")
    summary_md: str | None = Field(None, description="store URI of summary.md")
    metrics: dict[str, float] = Field(default_factory=dict, description="flat scalars (the KFP Metrics)")
    stages: dict[str, str] = Field(default_factory=dict, description="each stage's state")
    html_path: str | None = Field(None, description="local copy of report.html (with out_dir)")
    markdown_path: str | None = Field(None, description="local copy of summary.md (with out_dir)")
    report_error: str | None = Field(None, description="why the report could not be rendered")
