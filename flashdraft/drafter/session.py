"""Drafting one sequence during speculative decoding: a `DraftSession` holds the sequence's `ContextCache` (the
fused context projected to every layer's keys/values once), so each draft cycle runs only the B block slots
through the layers and extends the cache with the newly verified positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class ContextCache:
    """Per draft layer, the keys (RoPE applied) and values [1, kv_heads, S, head_dim] of the fused target context
    of one sequence: what every draft cycle reads and only newly verified positions extend."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int


class SessionDrafter(Protocol):
    """What a session calls on its drafter (DFlashDrafter, dflash_drafter.py, which builds sessions): named here
    so this module depends on no drafter module."""

    def extend_context(self, cache: ContextCache | None, features: torch.Tensor) -> ContextCache: ...

    def cached_draft_hidden(self, cache: ContextCache, last_token: int,
                            block_size: int | None = None) -> torch.Tensor: ...

    def draft_hidden(self, context_features: torch.Tensor, last_token: int,
                     block_size: int | None = None) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def propose_from_hidden(self, hidden: torch.Tensor, last_token: int) -> torch.Tensor: ...


class DraftSession:
    """One sequence's drafting state: `extend` with the features of newly verified positions, `propose` the drafts
    after the newest verified token (B-1, or fewer: a shorter block). cached=False recomputes the whole context
    every cycle (the reference for the cache)."""

    def __init__(self, drafter: SessionDrafter, cached: bool = True):
        self.drafter, self.cached = drafter, cached
        self.cache: ContextCache | None = None
        self.features: torch.Tensor | None = None

    def extend(self, features: torch.Tensor, tokens: torch.Tensor | None = None) -> None:
        """`tokens` (the positions' ids, for proposers that read them) is not needed: the features carry them."""
        if self.cached:
            self.cache = self.drafter.extend_context(self.cache, features)
        else:
            self.features = features if self.features is None else torch.cat([self.features, features])

    def logits(self, last_token: int) -> torch.Tensor:
        return self.drafter.logits(self.hidden(last_token))

    def hidden(self, last_token: int, num_drafts: int | None = None) -> torch.Tensor:
        block = None if num_drafts is None else num_drafts + 1
        if self.cached:
            return self.drafter.cached_draft_hidden(self.cache, last_token, block)
        return self.drafter.draft_hidden(self.features, last_token, block)

    def propose(self, last_token: int, num_drafts: int | None = None) -> torch.Tensor:
        """DFlash: the argmax of each slot. DFlash2: the selector's greedy walk over the top-k candidates.

        `num_drafts` k < B-1 drafts a shorter block, [last, MASK x k], as vLLM's DFlash proposer does with
        num_speculative_tokens=k (its query is 1 + k tokens): the slots attend to each other, so the k drafts of a
        short block are not the first k of a full one (docs/serving.md)."""
        return self.drafter.propose_from_hidden(self.hidden(last_token, num_drafts), last_token)
