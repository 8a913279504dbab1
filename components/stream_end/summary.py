"""The stream-end task's summary: the streaming extract loop's end marker."""

from __future__ import annotations

from pydantic import Field

from flashdraft.run.stage import StageSummary


class StreamEndSummary(StageSummary):
    """components/stream_end/stream_end.py: the streaming extract loop's end marker."""

    shards: int | None = Field(None, description="shards extracted")
    state: str | None = Field(None, description="the marker written (EOS)")
