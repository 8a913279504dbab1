"""The stream-end stage's declaration (read by the registry, flashdraft/run/registry.py)."""

from flashdraft.components.stream_end.summary import StreamEndSummary
from flashdraft.run.stage import StageSpec

SPEC = StageSpec(
    "stream-end", StreamEndSummary, "cpu", 900, run="flashdraft.components.stream_end.stream_end:end_stream",
    reuse=False, trains=True,
    command=False, upstream=("extract",), doc="Streaming: tell the trainer the extract loop ended (EOS or FAILED).",
    component="flashdraft.pipelines.stages:stream_end")
