"""Evaluate only: `run-local` with `drafter.init: pretrained` and `training.max_steps: 0` evaluates the session's
tiny streaming run's drafter as is, through plan, prep, evaluate, export and the report, with no generate, extract
or train task; the same drafter on the same held-out prompts gives the source run's tau exactly."""

from __future__ import annotations

import pytest

from flashdraft.components.export.card import CARD_FILE, card_meta
from flashdraft.pipelines.local import run_local
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


@pytest.mark.integration
def test_an_evaluate_only_run_evaluates_the_pretrained_drafter_and_trains_nothing(tiny_streaming_run, tmp_path):
    source = tiny_streaming_run.cfg
    assert tiny_streaming_run["result"]["state"] == "SUCCEEDED"
    source_store = open_store(source.storage, source.run_id)
    checkpoints = source_store.url(layout.CHECKPOINTS + "/")
    from flashdraft.components.evaluate.summary import EvaluateSummary

    theirs = EvaluateSummary.model_validate(source_store.get_json_verified(layout.metrics_key("evaluate")))
    # the source's draft length: `auto` picks k from timings, which two processes need not share
    cfg = source.with_overrides({"run_id": "evaluate-only", "mode.kind": "offline", "drafter.init": "pretrained",
                                 "drafter.init_from": checkpoints, "training.max_steps": 0,
                                 "eval.num_draft_tokens": theirs.draft_length.num_drafts,
                                 "storage.root": f"file://{tmp_path}/runs"})
    result = run_local(cfg, str(tmp_path / "kfp"), exports_dir=tmp_path / "exports")
    assert result["state"] == "SUCCEEDED", result["error"]
    states = {s.stage: s.state for s in result["statuses"]}
    assert states["plan"] == states["prep"] == states["evaluate"] == states["export"] == "done", states
    assert states["generate"] == states["extract"] == states["train"] == "not run", states
    store = open_store(cfg.storage, cfg.run_id)
    assert not store.list(f"{layout.RESPONSES}/") and not store.list(f"{layout.CHECKPOINTS}/")
    assert not store.list(f"{layout.STATUS}/generate") and not store.list(f"{layout.STATUS}/train")

    mine = EvaluateSummary.model_validate(store.get_json_verified(layout.metrics_key("evaluate")))
    assert mine.evaluate_only and mine.parent.source == checkpoints and mine.parent.format == "flashdraft"
    assert mine.baseline is None and mine.lossless.passed
    assert [(s.name, s.prompts, s.tau) for s in mine.suites] == [(s.name, s.prompts, s.tau) for s in theirs.suites]

    card = (tmp_path / "exports" / cfg.run_id / "zlab" / CARD_FILE).read_text()
    meta = card_meta(card)["flashdraft"]
    assert meta["parent"]["sha256"] == mine.parent.sha256 and meta["training"]["step"] == 0
    assert "## Parent" in card and "evaluated as is, not trained here" in card
    report = open(result["report"]).read()
    assert "Pretrained parent" in report and mine.parent.sha256 in report and "pretrained drafter, as is" in report
