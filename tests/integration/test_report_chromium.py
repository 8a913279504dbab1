"""The run report rendered in headless Chromium (Debian's chromium, a real browser): its charts decoded and its
numbers present, on an evaluated run, a failed run and a run with two suites and a held-out curve. The report's
other checks (no browser) are tests/unit/test_report.py; the runs are tests/support/report_runs.py."""

from __future__ import annotations

import re
from pathlib import Path

from support.report_runs import chromium_dom

from flashdraft.components.report.report import run_report
from flashdraft.run.reporting import fmt_bytes
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


def test_report_renders_charts_and_numbers_in_chromium(evaluated_run, tmp_path):
    cfg, metrics, drafter_uri = evaluated_run
    result = run_report(cfg, out_dir=tmp_path / "out")
    dom = chromium_dom(Path(result.html_path), tmp_path)
    images = re.findall(r"<img [^>]*>", dom)
    ids = {re.search(r"id=\"chart-(\w+)\"", i).group(1) for i in images}
    assert ids == {"acceptance", "tau", "suite_tau", "draft_length"}  # no training metrics: no training charts
    assert all('src="data:image/png;base64,' in i and 'data-decoded="yes"' in i for i in images)
    text = re.sub(r"<[^>]+>", " ", dom)
    assert f"{metrics.drafter.tau:g}" in text and f"{metrics.baseline.tau:g}" in text
    assert f"{metrics.target.tokens_per_s:,.3f}".rstrip("0").rstrip(".") in text
    assert "PASSED" in text and "train: not run" in text and drafter_uri in text
    plan = open_store(cfg.storage, cfg.run_id).get_json_verified(layout.metrics_key("plan"))
    assert fmt_bytes(plan["codecs"][plan["codec"]]["total_bytes"]) in text
    assert result.metrics["tau"] == metrics.drafter.tau
    assert result.metrics["lossless_passed"] == 1.0
    summary = Path(result.markdown_path).read_text()
    assert "| trained drafter |" in summary and "## Lossless check" in summary


def test_report_shows_the_failed_stage_its_error_and_log_and_later_stages_not_run_in_chromium(failed_run, tmp_path):
    result = run_report(failed_run, out_dir=tmp_path / "out", run_over=True)
    dom = chromium_dom(Path(result.html_path), tmp_path)
    rows = {re.match(r"<td>([^<]*)</td>", m.group(2)).group(1): (m.group(1), re.sub(r"<[^>]+>", " ", m.group(2)))
            for m in re.finditer(r"<tr( class=\"[\w-]+\")?>(<td>[\s\S]*?)</tr>", dom)}
    stage_rows = {k: v for k, v in rows.items() if k in ("plan", "prep", "generate", "extract", "train", "evaluate",
                                                         "export")}
    assert set(stage_rows) == {"plan", "prep", "generate", "extract", "train", "evaluate", "export"}
    cls, text = stage_rows["generate"]
    assert cls == ' class="failed"'
    assert "failed: ValueError: CUDA out of memory while generating prompt p-17" in text
    assert "shard 1" in text and "/var/log/flashdraft/generate-shard-00001.log" in text
    for stage in ("extract", "train", "evaluate", "export"):
        assert stage_rows[stage][0] == ' class="not-run"' and "not run" in stage_rows[stage][1], stage
    assert "done" in stage_rows["plan"][1] and "bytes/token planned" in stage_rows["plan"][1]
    assert "30 prompts kept, 2 quarantined" in stage_rows["prep"][1]
    text = re.sub(r"<[^>]+>", " ", dom)
    plan = open_store(failed_run.storage, failed_run.run_id).get_json_verified(layout.metrics_key("plan"))
    assert fmt_bytes(plan["codecs"][plan["codec"]]["total_bytes"]) in text, "figures that exist are still shown"
    assert "evaluate: not run" in text
    summary = Path(result.markdown_path).read_text()
    assert "| generate | failed: ValueError: CUDA out of memory" in summary and "| train | not run |" in summary
    assert result.metrics["generate_state"] == -1.0 and result.metrics["train_state"] == 0.0
    assert result.metrics["plan_state"] == 1.0 and result.metrics["prep_prompts_kept"] == 30.0


def test_report_shows_the_paper_table_and_the_heldout_curve_in_chromium(suites_run, tmp_path):
    cfg, evaluated = suites_run
    result = run_report(cfg, out_dir=tmp_path / "out")
    dom = chromium_dom(Path(result.html_path), tmp_path)
    images = re.findall(r"<img [^>]*>", dom)
    ids = {re.search(r"id=\"chart-(\w+)\"", i).group(1) for i in images}
    assert {"suite_tau", "heldout_tau", "train_accuracy", "train_loss"} <= ids
    assert all('data-decoded="yes"' in i for i in images)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    he = evaluated.suites[1]
    assert "Per-suite results (paper layout)" in text
    row = (f"humaneval 1 off {he.tau:.2f} " + " ".join(f"{a:.2f}" for a in he.acceptance_per_position)
           + f" {he.speedup:.2f}x 5.94 DFlash (z-lab), Qwen3.6-27B")
    assert row in text
    assert "Training vs held-out accuracy per position" in text
    assert "1 0.700 0.500" in text and "offline tau - 2" in text  # position 1: train 0.7, held-out 300/600
    assert result.metrics["tau_humaneval"] == he.tau and result.metrics["tau_heldout"] == evaluated.drafter.tau
    assert result.metrics["heldout_offline_tau"] == 2.0 and result.metrics["heldout_accuracy_1"] == 0.5
    summary = Path(result.markdown_path).read_text()
    assert "| suite | prompts | thinking | tau |" in summary and "| humaneval | 1 | off |" in summary
