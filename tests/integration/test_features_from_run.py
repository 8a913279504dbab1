"""Issue 50: extract once, train many, on the tiny preset under kfp.local (`run-local`): a second run with
`data.features_from` the first and another `training.lr` has no prep, generate or extract task, evaluates
lossless and leaves the source's features byte-identical; status and the model card name the source."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.config import load_config
from flashdraft.pipelines.local import run_local
from flashdraft.run import source, status
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.integration
def test_a_run_on_another_runs_features_trains_evaluates_lossless_and_leaves_them_untouched(tmp_path):
    root = tmp_path / "runs"
    base = load_config(preset="tiny", overrides={"storage.root": f"file://{root}", "run_id": "base"})
    assert run_local(base, str(tmp_path / "kfp"), exports_dir=tmp_path / "exports")["state"] == "SUCCEEDED"
    features, before = root / "base" / layout.FEATURES, tree_digest(root / "base" / layout.FEATURES)
    source_files = set(tree_digest(root / "base"))
    assert before, "the source run stored features"

    reader = base.with_overrides({"run_id": "lr", "data.features_from": f"file://{root}/base",
                                  "training.lr": 3e-3})
    result = run_local(reader, str(tmp_path / "kfp"), exports_dir=tmp_path / "exports")
    assert result["state"] == "SUCCEEDED", result["error"]
    store = open_store(reader.storage, "lr")
    ran = {r.stage for r in status.read_records(store)}
    assert ran >= {"plan", "train", "evaluate", "export"} and not ran & {"prep", "generate", "extract"}
    assert not store.list(f"{layout.FEATURES}/") and not store.list(f"{layout.PROMPTS}/"), "read in place"
    evaluation = EvaluateSummary.model_validate(store.get_json_verified(layout.metrics_key("evaluate")))
    assert evaluation.drafter is not None and all(s.lossless_passed for s in evaluation.suites)
    assert tree_digest(features) == before, "the source's features are byte-identical"
    added = set(tree_digest(root / "base")) - source_files
    assert added and all(p.startswith(f"{layout.READERS}/lr.json") for p in added), added
    assert [r.run_id for r in source.readers(open_store(base.storage, "base"))] == ["lr"]

    card = (Path(result["exports"]["zlab"]) / "README.md").read_text()
    assert f"features of run `file://{root}/base`" in card
    shown = CliRunner().invoke(app, ["status", "--run", f"file://{root}/lr"])
    assert shown.exit_code == 0 and f"features from run file://{root}/base" in shown.output, shown.output
    shown = CliRunner().invoke(app, ["status", "--run", f"file://{root}/base"])
    assert shown.exit_code == 0 and f"read by: lr (file://{root}/lr)" in shown.output, shown.output

    # --from on the source names its reader and needs the confirmation flag
    refused = CliRunner().invoke(app, ["run-local", "--preset", "tiny", "--set", f"storage.root=file://{root}",
                                       "--set", "run_id=base", "--workdir", str(tmp_path / "kfp"),
                                       "--from", "extract"])
    assert refused.exit_code == 1 and "lr (" in refused.output and "--confirm-readers" in refused.output
    assert tree_digest(features) == before
