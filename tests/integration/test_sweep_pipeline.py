"""The sweep pipeline a cluster runs (`flashdraft compile --grid`), run whole under kfp.local's real runner on the
tiny preset: one extraction, a ParallelFor over two variants each training, evaluating lossless, exporting and
reporting as its own run, and the base run's report (the exit handler) ending with the variants side by side."""

from __future__ import annotations

import pytest
from support.report_runs import READERS_SECTION, markdown_section

from flashdraft.config import load_config
from flashdraft.config.sweep import SweepSpec
from flashdraft.pipelines.local import localize, run_local
from flashdraft.pipelines.sweep import pipeline_variants, plan_sweep
from flashdraft.run import status
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


@pytest.mark.integration
def test_the_compiled_sweep_runs_one_extraction_and_its_exit_report_shows_the_variants_side_by_side(tmp_path):
    cfg = localize(load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs",
                                                         "run_id": "base"}))
    sweep = plan_sweep(cfg, SweepSpec.model_validate({"grid": {"training.lr": [1e-3, 3e-3]}}))
    result = run_local(sweep.base, str(tmp_path / "kfp"), variants=pipeline_variants(sweep),
                       exports_dir=tmp_path / "exports")
    assert result["state"] == "SUCCEEDED", result["error"]
    base = open_store(cfg.storage, "base")
    extract = status.stage_records(base, "extract", per_shard=True)
    assert len(extract) == cfg.data.num_shards and all(r.state == "done" for r in extract)
    for run_id in ("base-lr0.001", "base-lr0.003"):
        store = open_store(cfg.storage, run_id)
        records = {r.stage: r.state for r in status.read_records(store)}
        assert records == dict.fromkeys(("train", "evaluate", "export", "report"), "done"), (run_id, records)
        assert store.is_committed(layout.REPORT_MARKDOWN)
    summary = base.get_verified(layout.REPORT_MARKDOWN).decode()
    section = markdown_section(summary, READERS_SECTION)
    rows = [line for line in section.splitlines() if "/runs/base-" in line]
    assert [r.split(" | ")[0].rsplit("/", 1)[-1] for r in rows] == ["base-lr0.001", "base-lr0.003"], section
    assert all(" | passed | " in r for r in rows), rows
    num_train = base.get_json_verified(layout.metrics_key("prep"))["num_train"]
    assert all(f" | dflash | - | {num_train} | " in r for r in rows), rows  # the samples its features hold
    assert "| training.lr | 0.001 | 0.003 |" in markdown_section(summary, f"{READERS_SECTION}: config keys that differ")
