"""The feature-source protocol: what extraction needs from a backend that runs the target.

Both backends conform: `HFFeatureSource` (components/extract/extract.py, transformers with forward hooks, in this
process) and `VLLMFeatureSource` (components/extract/vllm_backend.py, vLLM in a worker subprocess). It lives in the
extract stage, not the core, because only extraction uses it; its input (`Row`) and its error (`ExtractionError`)
live here too, below both extract.py and the backends, so neither imports the other back. The core's contract for
what comes out is the feature shard format (flashdraft/features/shard.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class ExtractionError(RuntimeError):
    """A sample that cannot be extracted faithfully (names the sample)."""


@dataclass
class Row:
    """One committed response as extraction feeds it to a source: its tokens and which of them are the response."""

    sample_id: str
    input_ids: list[int]
    loss_mask: list[int]


class FeatureSource(Protocol):
    """Hidden states of the configured target layers for batches of token sequences."""

    layer_ids: list[int]  # the target layers captured, in the order of the features' layer axis

    def features(self, batch: list[Row]) -> list[torch.Tensor]:
        """One CPU bfloat16 tensor [len(row.input_ids), len(layer_ids), hidden] per row, in batch order.

        Must raise ExtractionError (never truncate or pad silently) when the target saw a different number of
        positions or layers than asked: a stored sample must line up token for token with its response."""
        ...

    def close(self) -> None:
        """Release the model (or stop the worker). Called once, also after a failure; features() is not called
        after it."""
        ...
