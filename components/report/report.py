"""`flashdraft report`: one self-contained HTML page, a Markdown summary and a flat dict of scalars for a run.

Everything comes from what the stages committed to the run's store, and every section but the run's own (verdict
line, run, stages, throughput) is a stage's: each registered stage's report section (its stage object's `report`
method, flashdraft/run/reporting.py). The report can be regenerated at any time with `flashdraft
report --run RUN_URI`, and it renders for a partial or failed run: a missing section says "not run" instead of
failing. A run whose features other runs trained on (a sweep's base run) ends with those runs side by side. The
outputs are committed under reports/ and, for a KFP component, also written to local artifact paths.
"""

from __future__ import annotations

import html
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashdraft.components.report.compare import readers_sections
from flashdraft.components.report.gather import gather, stored_config
from flashdraft.components.report.summary import ReportSummary
from flashdraft.config import RunConfig
from flashdraft.run import registry, status
from flashdraft.run.provenance import Provenance
from flashdraft.run.provenance import current as current_provenance
from flashdraft.run.reporting import RunView, Section, StageReport, fmt
from flashdraft.run.source import read_source
from flashdraft.run.stage import numbers
from flashdraft.run.target_pin import recorded_pin
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore, open_store

log = logging.getLogger(__name__)
NOT_RUN = status.NOT_RUN
STATE_CODES = {"done": 1.0, "running": 0.5, NOT_RUN: 0.0, "failed": -1.0}  # <stage>_state in the Metrics


def stage_reports(run: RunView) -> list[StageReport]:
    """Every registered stage's contribution, in pipeline order."""
    reports = (stage.report(run.summary(stage.name), run) for stage in registry.current())
    return [r for r in reports if r is not None]


@dataclass
class Report:
    """The report's content: the run, each stage's part, the software it ran."""

    run: RunView
    parts: list[StageReport]
    provenance: Provenance
    provenance_source: str  # the stage that recorded it, or "report" (this process)

    @classmethod
    def of(cls, run: RunView) -> Report:
        recorded, source = run.provenance()
        return cls(run, stage_reports(run), recorded or current_provenance(), source)


# -- the run's own figures --------------------------------------------------------------------------------------


def busy_seconds(statuses: list[status.StageStatus]) -> float | None:
    """Wall time the run's tasks took: the union of their [started, ended] intervals (overlapping streaming
    stages counted once; a reused task counts with its original run's interval, the idle gap between runs not)."""
    spans = sorted((t.started, t.ended) for s in statuses for t in s.tasks if t.ended is not None)
    if not spans:
        return None
    total, (start, end) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > end:
            total, start = total + end - start, a
        end = max(end, b)
    return round(total + end - start, 1)


def run_date(statuses: list[status.StageStatus]) -> str | None:
    """When the run's last task ended, UTC."""
    ends = [t.ended for s in statuses for t in s.tasks if t.ended is not None]
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(max(ends))) if ends else None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:,.1f} s" if seconds < 120 else f"{seconds / 60:,.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:,.1f} h"


def verdict(report: Report) -> str:
    """The report's first line: the stages' parts (tau per suite, lossless, speedup), wall time, date, commit."""
    statuses, prov = report.run.statuses, report.provenance
    parts = [p for part in report.parts for p in part.verdict]
    parts += [f"wall time {_duration(busy_seconds(statuses))}", run_date(statuses) or "no date",
              f"flashdraft {prov.flashdraft} commit {prov.short_commit}"]
    return " | ".join(parts)


def scalar_metrics(report: Report) -> dict[str, float]:
    """Flat numbers for a KFP Metrics artifact: the stages' scalars, then every stage's state (1 done, 0.5
    running, 0 not run, -1 failed), duration and figures."""
    out: dict[str, float] = {}
    for part in report.parts:
        out.update(part.scalars)
    for s in report.run.statuses:
        name = s.stage.replace("-", "_")
        out[f"{name}_state"] = STATE_CODES[s.state]
        if s.duration_s is not None:
            out[f"{name}_duration_s"] = float(s.duration_s)
        out.update({f"{name}_{k}": float(v) for k, v in s.figures.items()})
    return out


def throughput_rows(metrics: dict[str, dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """(metrics file, key, value) for every rate a stage reported (keys ending in per_s, or naming a
    throughput), one level of nesting deep, e.g. evaluate's target.tokens_per_s."""
    return [(name, key, v) for name in sorted(metrics) for key, v in numbers(metrics[name], sep=".").items()
            if key.endswith("per_s") or "per_s_" in key or "throughput" in key]


def features_source_rows(store: ObjectStore) -> list[list[str]]:
    """The Run table's row naming the run whose prompts, responses and features this run read
    (data.features_from): its prep, generate and extract are that run's, so they have no row of their own here."""
    record = read_source(store)
    return [["features from", f"run {record.source} (prep, generate and extract are its results)"]] \
        if record else []


def sections(report: Report) -> list[Section]:
    """The report's content as (title, table rows or a note), shared by the HTML and the Markdown output."""
    run, prov = report.run, report.provenance
    out: list[Section] = [("Verdict", verdict(report))]
    out += [section for part in report.parts for section in part.lead]
    if warnings := [flag for part in report.parts for flag in part.flags]:
        out.append(("Flags", "; ".join(warnings)))
    target = (run.config or {}).get("target", {})
    out.append(("Run", [["run", run.run],
                        ["target", f"{target.get('model', '-')} ({target.get('source', '-')}, revision "
                                   f"{target.get('revision') or 'main'})"],
                        ["target weights", pin.line() if (pin := recorded_pin(run.store)) else "not pinned"],
                        ["date (last task ended)", run_date(run.statuses) or "-"],
                        ["wall time (tasks' busy time)", _duration(busy_seconds(run.statuses))],
                        [f"software ({'as exported' if report.provenance_source == 'export' else 'this report'})",
                         prov.line()], *features_source_rows(run.store)]))
    out.append(("Stages", [["stage", "state", "time", "figures"]] + [
        [s.stage, status.describe(s), "-" if s.duration_s is None else f"{s.duration_s:,.1f} s", s.headline or "-"]
        for s in run.statuses]))
    out += [section for part in report.parts for section in part.sections]
    rates = throughput_rows(run.metrics)
    out.append(("Per-stage throughput", [["metrics", "measure", "value"]] + [[a, b, fmt(c)] for a, b, c in rates]
                if rates else f"no stage reported a throughput ({NOT_RUN})"))
    return out + readers_sections(run.store)


_CSS = """body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}
th{background:#f3f3f3}.note{color:#555}tr.failed td{color:#b00020;font-weight:600}tr.not-run td{color:#888}
img{max-width:100%;margin:.5em 1em 1em 0}code{background:#f6f6f6}.verdict{font-size:1.1em;font-weight:600}
.flags{color:#b00020;font-weight:600}"""


def _html_table(rows: list[list[str]]) -> str:
    head, *body = rows if len(rows[0]) > 2 or rows[0][0] == "" else [None, *rows]
    parts = ["<table>"]
    if head:
        parts.append("<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>")
    parts += [f"<tr{_row_class(r)}>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body]
    return "".join(parts) + "</table>"


def _row_class(row: list[str]) -> str:
    """Stage rows: failed ones in red, not-run ones greyed (class names the state, for readers and tests)."""
    state = row[1] if len(row) > 1 else ""
    if state.startswith("failed"):
        return " class='failed'"
    return " class='not-run'" if state == NOT_RUN else ""


def render_html(report: Report) -> str:
    charts = {name: chart for part in report.parts for name, chart in part.charts.items()}
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>flashdraft report</title>"
             f"<style>{_CSS}</style></head><body><h1>flashdraft run report</h1>"]
    for title, body in sections(report):
        parts.append(f"<h2>{html.escape(title)}</h2>")
        note = {"Verdict": "verdict", "Flags": "flags"}.get(title, "note")  # the first line and warnings stand out
        parts.append(_html_table(body) if isinstance(body, list) else f"<p class='{note}'>{html.escape(body)}</p>")
    if charts:
        parts.append("<h2>Charts</h2>")
        parts += [f"<img id='chart-{name}' alt='{html.escape(chart.title)}' "
                  f"src='data:image/png;base64,{chart.png_base64}'>" for name, chart in charts.items()]
    if report.run.config:
        parts.append("<h2>Config</h2><pre>" + html.escape(json.dumps(report.run.config, indent=2)) + "</pre>")
    return "\n".join(parts) + "</body></html>\n"


def render_markdown(report: Report) -> str:
    lines = ["# flashdraft run report", ""]
    for title, body in sections(report):
        lines += [f"## {title}", ""]
        if isinstance(body, str):
            lines += [body, ""]
            continue
        head, *rest = body if len(body[0]) > 2 or body[0][0] == "" else [[""] * len(body[0]), *body]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rest] + [""]
    return "\n".join(lines)


# -- entry points -------------------------------------------------------------------------------------------------


def build_report(store: ObjectStore, config: dict[str, Any] | None = None,
                 out_dir: str | Path | None = None, run_over: bool = False) -> ReportSummary:
    """Render from the store's committed metrics and stage records, commit reports/{report.html,summary.md,
    metrics.json}; with `out_dir`, also write them there (KFP artifact paths). `config` defaults to the one stored
    by an earlier report run. run_over: see `gather`."""
    if config is None:
        config = stored_config(store)
    else:
        store.commit_json(layout.REPORT_CONFIG, config)
    report = Report.of(gather(store, config, run_over))
    page, summary, scalars = render_html(report), render_markdown(report), scalar_metrics(report)
    store.commit(layout.REPORT_HTML, page.encode())
    store.commit(layout.REPORT_MARKDOWN, summary.encode())
    store.commit_json(layout.REPORT_SCALARS, scalars)
    result = ReportSummary(report_html=store.url(layout.REPORT_HTML), summary_md=store.url(layout.REPORT_MARKDOWN),
                           metrics=scalars, stages={s.stage: status.describe(s) for s in report.run.statuses})
    if out_dir is not None:
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "report.html").write_text(page)
        (folder / "summary.md").write_text(summary)
        (folder / "metrics.json").write_text(json.dumps(scalars, indent=2))
        result.html_path, result.markdown_path = str(folder / "report.html"), str(folder / "summary.md")
    log.info("report: %s", result.report_html)
    return result


def run_report(cfg: RunConfig, out_dir: str | Path | None = None, run_over: bool = False) -> ReportSummary:
    """The pipeline's report step (also its exit handler): works whatever subset of stages has run."""
    return build_report(open_store(cfg.storage, cfg.run_id), cfg.model_dump(mode="json"), out_dir, run_over)
