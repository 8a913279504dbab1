"""What prep adds to the run report: where the training replies came from (data.responses), flagged when they are
the dataset's own and not the target's (the drafter then learns a distribution the target does not produce)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashdraft.components.prep.summary import RESPONSES_SOURCE
from flashdraft.run.reporting import RunView, StageReport

if TYPE_CHECKING:
    from flashdraft.components.prep.summary import PrepSummary


def report(prep: PrepSummary | None, run: RunView) -> StageReport:
    responses = (prep.responses if prep is not None else None) or (run.config or {}).get("data", {}).get("responses")
    if responses is None:
        return StageReport()
    rows = [["responses", RESPONSES_SOURCE[responses]]]
    if prep is not None and prep.reply_tokens is not None:
        rows.append(["reply tokens written by prep", f"{prep.reply_tokens:,}"])
    if prep is not None and prep.num_eval is not None:
        rows.append(["held-out prompts", f"{prep.num_eval:,}, answered by the target when evaluated"])
    flags = [f"responses: {RESPONSES_SOURCE['dataset']}"] if responses == "dataset" else []
    return StageReport(flags=flags, sections=[("Training data (prep)", rows)])
