"""Anchor sampling: where the training blocks start.

An anchor `a` is eligible when `loss_mask[a]` and `loss_mask[a+1]` are both 1 (the block starts on a response token
and its first label is a response token) and it is not inside the last B positions (`a < T - B`), so every slot
1..B-1 has a label. Up to `max_anchors` are drawn without replacement and kept sorted. The draw is a pure function
of (seed, epoch, sample_id): re-sampled every epoch, identical after a resume or on another rank.
"""

from __future__ import annotations

import hashlib

import torch


def anchor_seed(seed: int, epoch: int, sample_id: str) -> int:
    digest = hashlib.sha256(f"{seed}:{epoch}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def eligible_anchors(loss_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """Sorted candidate positions (LongTensor) for a 1-D loss mask."""
    lm = loss_mask.bool()
    T = lm.numel()
    if T <= block_size:
        return torch.empty(0, dtype=torch.long)
    ok = lm[:-1] & lm[1:]          # ok[a] = lm[a] & lm[a+1], for a in 0..T-2
    ok = ok[: T - block_size]      # a < T - B
    return ok.nonzero().flatten()


def sample_anchors(loss_mask: torch.Tensor, block_size: int, max_anchors: int, *, seed: int, epoch: int,
                   sample_id: str) -> torch.Tensor:
    cand = eligible_anchors(loss_mask, block_size)
    if cand.numel() <= max_anchors:
        return cand
    gen = torch.Generator().manual_seed(anchor_seed(seed, epoch, sample_id))
    pick = torch.randperm(cand.numel(), generator=gen)[:max_anchors]
    return cand[pick].sort().values
