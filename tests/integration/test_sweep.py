"""`flashdraft sweep` (issue 50) on the tiny preset: three variants (DFlash at two learning rates, DFlash2) run one
extraction, each trains, evaluates lossless and exports as its own run reading the base run's features, and the
sweep ends with the variants side by side."""

from __future__ import annotations

import pytest
from support.report_runs import READERS_SECTION, markdown_section
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.config import load_config
from flashdraft.run import status
from flashdraft.storage.store import open_store


@pytest.mark.integration
def test_a_three_variant_sweep_runs_one_extraction_and_shows_the_variants_side_by_side(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the variants' export folders go to ./exports, as for a user
    root = f"file://{tmp_path}/runs"
    spec = tmp_path / "sweep.yaml"
    spec.write_text("variants:\n  - name: dflash2\n    overrides: {drafter.kind: dflash2}\n")
    out = CliRunner().invoke(app, ["sweep", "--preset", "tiny", "--set", f"storage.root={root}", "--set",
                                   "run_id=base", "--variants", str(spec), "--grid", "training.lr=1e-3,3e-3",
                                   "--workdir", str(tmp_path / "kfp")])
    assert out.exit_code == 0, out.output[-4000:]
    cfg = load_config(preset="tiny", overrides={"storage.root": root})
    base = open_store(cfg.storage, "base")
    extract = status.stage_records(base, "extract", per_shard=True)
    assert len(extract) == cfg.data.num_shards and all(r.state == "done" and r.attempt == 1 for r in extract)
    runs = ["base-dflash2", "base-lr1e-3", "base-lr3e-3"]
    for run_id in runs:
        records = {r.stage: r for r in status.read_records(open_store(cfg.storage, run_id))}
        assert {"train", "evaluate", "export"} <= set(records) and not {"prep", "generate", "extract"} & set(records)
        assert all(r.state == "done" for r in records.values()), run_id
    assert sorted(p.name for p in (tmp_path / "exports").iterdir()) == runs
    table = [line for line in out.output.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| variant | changes | state | tau heldout")
    rows = table[1:]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == ["dflash2", "lr1e-3", "lr3e-3"]
    assert all(" | done | " in r and " | yes | " in r for r in rows), rows  # evaluated, lossless
    # the base run's report (a cluster sweep's exit handler) ends with the variants side by side, as compare shows them
    summary = base.get("reports/summary.md").decode()
    section = markdown_section(summary, READERS_SECTION)
    compared = [line.split(" | ")[0].removeprefix("| ").rsplit("/", 1)[-1] for line in section.splitlines()
                if line.startswith("| ") and "/runs/" in line]
    assert compared == runs, section
    assert all(" | passed | " in line for line in section.splitlines() if "/runs/" in line), section
    differing = markdown_section(summary, f"{READERS_SECTION}: config keys that differ")
    assert "| drafter.kind | " in differing and "| training.lr | " in differing, differing
