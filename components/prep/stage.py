"""The prep stage's declaration (read by the registry, flashdraft/run/registry.py)."""

from flashdraft.components.prep.summary import PrepSummary
from flashdraft.run.stage import HOUR, StageSpec

SPEC = StageSpec(
    "prep", PrepSummary, "cpu", 4 * HOUR, run="flashdraft.components.prep.prep:run_prep",
    doc="Read, clean, dedupe, length-filter, shuffle and shard the prompts (quarantining bad rows).",
    reads=("data", "target.model", "target.source", "target.revision", "target.architecture",
           "target.trust_remote_code"),
    ignores=("data.expected_tokens_per_sample", "data.expected_samples", "data.max_response_tokens"),
    outputs=("prompts/",), cli="flashdraft.components.prep.cli:prep",
    component="flashdraft.pipelines.stages:prep")
