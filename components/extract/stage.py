"""The extract stage's declaration (read by the registry, flashdraft/run/registry.py)."""

from flashdraft.components.extract.summary import ExtractSummary
from flashdraft.run.stage import HOUR, StageSpec

SPEC = StageSpec(
    "extract", ExtractSummary, "inference", 24 * HOUR, run="flashdraft.components.extract.extract:run_extract",
    per_shard=True, trains=True, upstream=("generate",),
    doc="Capture the target's DFlash-layer hidden states for one generation shard into committed feature shards.",
    reads=("target", "features"), ignores=("features.queue_depth",),
    outputs=("features/",), report="flashdraft.components.extract.report_section:report",
    cli="flashdraft.components.extract.cli:extract",
    component="flashdraft.pipelines.stages:extract")
