"""The evaluate stage: speculative decoding with the drafter on every eval suite (registered in
components/stages.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.run.contract import Stage
from flashdraft.run.stage import HOUR, TARGET_HINTS

if TYPE_CHECKING:
    from flashdraft.config import RunConfig
    from flashdraft.run.reporting import RunView, StageReport


class Evaluate(Stage):
    name = "evaluate"
    summary = EvaluateSummary
    pool = "inference"
    timeout_s = 6 * HOUR
    target_use = "fetch"
    upstream = ("train",)
    continue_on = ("*",)
    doc = "Speculative decoding on every eval suite: tau, per-position acceptance, tokens/s, lossless check."
    # drafter.init/init_from: an evaluate-only run evaluates the pretrained drafter, a trained one compares with it
    reads = ("target", "eval", "features.layer_ids", "features.num_features", "data.chat_template_kwargs",
             "drafter.init", "drafter.init_from", "training.max_steps")
    ignores = TARGET_HINTS

    def run(self, cfg: RunConfig, shard: int | None = None) -> EvaluateSummary:
        from flashdraft.components.evaluate.evaluate import run_evaluate

        return run_evaluate(cfg)

    def command(self) -> Callable[..., None]:
        from flashdraft.components.evaluate.cli import evaluate

        return evaluate

    def report(self, summary: EvaluateSummary | None, run: RunView) -> StageReport:
        from flashdraft.components.evaluate.report_section import report

        return report(summary, run)
