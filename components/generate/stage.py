"""The generate stage's declaration (read by the registry, flashdraft/run/registry.py)."""

from flashdraft.components.generate.summary import GenerateSummary
from flashdraft.run.stage import HOUR, TARGET_HINTS, StageSpec

SPEC = StageSpec(
    "generate", GenerateSummary, "inference", 24 * HOUR, run="flashdraft.components.generate.generate:run_generate",
    per_shard=True, trains=True, upstream=("prep",),
    doc="Generate target responses for one prompt shard, committed chunk by chunk (resumable).",
    reads=("target", "generation", "data.max_response_tokens", "data.chat_template_kwargs"),
    ignores=(*TARGET_HINTS, "generation.data_parallel", "generation.enable_prefix_caching"),
    outputs=("responses/",), cli="flashdraft.components.generate.cli:generate",
    component="flashdraft.pipelines.stages:generate")
