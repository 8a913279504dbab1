"""The reduced draft vocabulary (EAGLE-3 / SpecForge draft-vocab style): the drafter scores only the K target
tokens the target itself writes most often, so the LM-head GEMMs of the loss (most of a small drafter's step)
shrink by V/K. A token outside the draft vocabulary can never be drafted;
its slots are left out of the loss. The choice is the K most frequent response tokens (loss_mask = 1) of the
training data, ties broken by the lower id; vLLM reads it back as `d2t` (draft index -> target id offsets).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def count_response_tokens(samples: Iterable[dict], vocab_size: int) -> torch.Tensor:
    """[V] int64 counts of the response tokens of `samples` (dicts with input_ids and loss_mask)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        ids = s["input_ids"].long()[s["loss_mask"].bool()]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def top_tokens(counts: torch.Tensor, k: int) -> torch.Tensor:
    """The k most frequent ids (ties: lower id first), sorted ascending."""
    if not 0 < k <= counts.numel():
        raise ValueError(f"drafter.draft_vocab_size={k}: must be in 1..{counts.numel()} (the target vocabulary)")
    order = torch.sort(-counts.long(), stable=True).indices  # stable: the lower id first among equal counts
    return order[:k].sort().values


def draft_labels(labels: torch.Tensor, valid: torch.Tensor, t2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Target-id labels -> draft indices; slots whose label is outside the draft vocabulary become invalid."""
    mapped = t2d[labels]
    return mapped.clamp_min(0), valid.bool() & (mapped >= 0)
