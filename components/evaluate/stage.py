"""The evaluate stage's declaration (read by the registry, flashdraft/run/registry.py)."""

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.run.stage import HOUR, TARGET_HINTS, StageSpec

SPEC = StageSpec(
    "evaluate", EvaluateSummary, "inference", 6 * HOUR, run="flashdraft.components.evaluate.evaluate:run_evaluate",
    upstream=("train",), continue_on=("*",),
    doc="Speculative decoding on every eval suite: tau, per-position acceptance, tokens/s, lossless check.",
    # drafter.init/init_from: an evaluate-only run evaluates the pretrained drafter, a trained one compares with it
    reads=("target", "eval", "features.layer_ids", "features.num_features", "data.chat_template_kwargs",
           "drafter.init", "drafter.init_from", "training.max_steps"),
    ignores=TARGET_HINTS, report="flashdraft.components.evaluate.report_section:report",
    cli="flashdraft.components.evaluate.cli:evaluate",
    component="flashdraft.pipelines.stages:evaluate")
