"""The stream-end stage: streaming's end-of-stream marker (registered in components/stages.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashdraft.components.stream_end.summary import StreamEndSummary
from flashdraft.run.contract import Stage

if TYPE_CHECKING:
    from flashdraft.config import RunConfig


class StreamEnd(Stage):
    name = "stream-end"
    summary = StreamEndSummary
    pool = "cpu"
    timeout_s = 900
    reuse = False
    trains = True
    has_command = False
    upstream = ("extract",)
    doc = "Streaming: tell the trainer the extract loop ended (EOS or FAILED)."

    def run(self, cfg: RunConfig, shard: int | None = None) -> StreamEndSummary:
        from flashdraft.components.stream_end.stream_end import end_stream

        return end_stream(cfg)
