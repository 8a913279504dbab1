"""Typed stage summaries: what a pipeline task hands to the next task stays small, whatever the run's length; a
misspelt field is an error where a summary is built."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.components.export.summary import ExportedFormat, ExportSummary
from flashdraft.components.extract.summary import ExtractSummary, PartStats
from flashdraft.components.prep.summary import PrepSummary
from flashdraft.components.report.summary import ReportSummary
from flashdraft.components.train.summary import TrainSummary
from flashdraft.pipelines.runtime import to_json


def test_a_long_training_history_stays_out_of_the_task_output():
    entry = {"step": 0, "loss": 2.5, "lr": 3e-3, "grad_norm": 1.0, "tokens": 256, "step_s": 0.1,
             "acc_by_pos": [0.5] * 7, "loss_by_pos": [2.0] * 7}
    summary = TrainSummary(steps=2000, tokens=512_000, tokens_per_s=1886.2,
                           history=[{**entry, "step": i} for i in range(2000)])
    assert len(json.dumps(summary.dump())) > 128 * 1024  # the committed metrics keep every step
    out = json.loads(to_json(summary))
    assert "history" not in out and out["steps"] == 2000 and out["tokens_per_s"] == 1886.2
    assert len(to_json(summary)) < 1000  # kfp.local passes it on a command line: one argument holds 128 KiB


def test_summaries_without_bulky_fields_hand_off_everything():
    summary = EvaluateSummary.model_validate({"drafter": {"tau": 2.1, "speedup": 1.2}, "num_prompts": 16})
    assert json.loads(to_json(summary)) == summary.dump()


@pytest.mark.parametrize("model", [PrepSummary, ExtractSummary, PartStats, ExportSummary, ExportedFormat,
                                   ReportSummary])
def test_a_misspelt_summary_field_is_a_construction_error(model):
    with pytest.raises(ValidationError, match="tokns"):
        model(tokns=3)


def test_every_stage_summary_declares_store_io():
    """Each stage records its store operations as `store_io`: a declared field, not an extra key, even in a summary
    that allows extra keys."""
    summary = EvaluateSummary(num_prompts=3, store_io={"gets": 2, "retries": 0})
    assert summary.model_extra == {} and summary.dump()["store_io"] == {"gets": 2, "retries": 0}
