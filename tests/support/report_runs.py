"""The report tests' runs (tests/unit/test_report.py, tests/integration/test_report_chromium.py; registered by
tests/conftest.py's `pytest_plugins`) and the headless-Chromium page reader."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from flashdraft.components.plan.planner import run_plan
from flashdraft.config import load_config
from flashdraft.run.runner import run_task
from flashdraft.storage import layout
from flashdraft.storage.store import open_store

from .shared_runs import copy_run

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=5000"]
# Appended to a copy of the page: after load, every <img> records whether the browser really decoded it.
PROBE = ("<script>window.addEventListener('load',()=>{for(const i of document.images)"
         "{i.setAttribute('data-decoded', i.complete && i.naturalWidth > 0 ? 'yes' : 'no')}})</script>")


READERS_SECTION = "Runs trained on these features (data.features_from)"


def markdown_section(summary: str, title: str) -> str:
    """The body of the report's `## {title}` section in its Markdown summary (up to the next section)."""
    return summary.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def chromium_dom(html_file: Path, tmp_path: Path) -> str:
    """The DOM after Chromium loaded and laid out the page (with the decode probe)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    probed = tmp_path / "probed.html"
    probed.write_text(html_file.read_text().replace("</body>", PROBE + "</body>"))
    out = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chrome'}", "--dump-dom",
                          probed.as_uri()], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.fixture()
def evaluated_run(tiny_evaluated, tmp_path):
    """The session's tiny evaluation (plan + prep + a committed drafter + evaluate; tests/support/shared_runs.py),
    copied: a report commits into the store. Enough for every chart but training's."""
    cfg, _ = copy_run(tiny_evaluated, tmp_path / "copy")
    store = open_store(cfg.storage, cfg.run_id)  # the copy's drafter, as commit_drafter returned the shared run's
    drafter_uri = store.url(store.get_json_verified(layout.CHECKPOINT_LATEST)["prefix"])
    assert tiny_evaluated["drafter_uri"].endswith(drafter_uri.removeprefix(f"file://{tmp_path}/copy"))
    return cfg, tiny_evaluated["metrics"], drafter_uri


@pytest.fixture()
def failed_run(tmp_path, monkeypatch):
    """plan and prep done, generate shard 0 done, shard 1 raised: records written by the pipeline's stage wrapper
    (`runner.run_task`) exactly as a component body writes them."""

    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs"})
    run_task(cfg, "plan", body=lambda: run_plan(cfg))
    run_task(cfg, "prep", body=lambda: {"kept": 30, "num_train": 26, "num_eval": 4, "quarantined": 2})
    run_task(cfg, "generate", body=lambda: {"samples": 13, "generated_tokens": 300, "generation_seconds": 3.0},
                      shard=0)

    def boom() -> dict:
        raise ValueError("CUDA out of memory while generating prompt p-17")

    monkeypatch.setenv("FLASHDRAFT_TASK_LOG", "/var/log/flashdraft/generate-shard-00001.log")
    with pytest.raises(ValueError, match="out of memory"):
        run_task(cfg, "generate", body=boom, shard=1)
    monkeypatch.delenv("FLASHDRAFT_TASK_LOG")
    return cfg


@pytest.fixture()
def suites_run(tiny_evaluated, tmp_path):
    """The session's tiny evaluation (two suites: heldout, humaneval with thinking off; published figures from the
    shipped reference), copied, plus a metrics/train.json with a held-out curve, as the trainer writes it."""
    cfg, _ = copy_run(tiny_evaluated, tmp_path / "copy")
    evaluated = tiny_evaluated["metrics"]
    store = open_store(cfg.storage, cfg.run_id)
    B1 = cfg.drafter.block_size - 1
    history = [{"step": i, "loss": 5.0 - i / 100, "acc_by_pos": [min(1.0, i / 400 / (k + 1)) for k in range(B1)]}
               for i in range(1, 301)]
    heldout = [{"step": s, "acc_by_pos": [s / 600 / (k + 1) for k in range(B1)], "tau": 1.0 + s / 300, "blocks": 9}
               for s in (0, 100, 200, 300)]
    store.commit_json(layout.metrics_key("train"), {
        "steps": 300, "tokens": 9000, "history": history, "heldout": heldout,
        "final": {"loss": 2.0, "acc_by_pos": [0.7 / (k + 1) for k in range(B1)]}})
    return cfg, evaluated
