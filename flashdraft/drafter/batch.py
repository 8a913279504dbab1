"""Packing samples into one training row: token-budget batching without padding.

Samples are concatenated; each keeps its own RoPE positions (0..T-1) and a document id, so a block only sees
context from its own sample. Anchors are sampled per sample (anchors.py) and shifted to packed indices.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from flashdraft.drafter.anchors import sample_anchors
from flashdraft.drafter.attention import BlockLayout
from flashdraft.drafter.loss import block_labels


@dataclass
class PackedBatch:
    features: torch.Tensor        # [S, n*H]
    input_ids: torch.Tensor       # [S]
    positions: torch.Tensor       # [S] position inside its own sample
    doc: torch.Tensor             # [S]
    anchors: torch.Tensor         # [N] packed indices
    labels: torch.Tensor          # [N, B-1]
    valid: torch.Tensor           # [N, B-1]
    block_size: int
    num_samples: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def layout(self) -> BlockLayout:
        return BlockLayout(self.num_tokens, self.block_size, self.anchors, self.doc, self.doc[self.anchors])

    def to(self, device) -> PackedBatch:
        moved = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
                 for k, v in self.__dict__.items()}
        return PackedBatch(**moved)

    def drafter_inputs(self) -> tuple:
        """Positional args of `DFlashDrafter.forward`."""
        return (self.features, self.layout(), self.positions, self.input_ids[self.anchors],
                self.positions[self.anchors])


def pack(samples: list[dict], block_size: int, max_anchors: int, *, seed: int, epoch: int) -> PackedBatch:
    feats, ids, pos, doc, anchors = [], [], [], [], []
    offset = 0
    for d, s in enumerate(samples):
        T = int(s["input_ids"].numel())
        a = sample_anchors(s["loss_mask"], block_size, max_anchors, seed=seed, epoch=epoch,
                           sample_id=str(s["sample_id"]))
        feats.append(s["features"])
        ids.append(s["input_ids"].long())
        pos.append(torch.arange(T))
        doc.append(torch.full((T,), d, dtype=torch.long))
        anchors.append(a + offset)
        offset += T
    input_ids = torch.cat(ids)
    loss_mask = torch.cat([s["loss_mask"].bool() for s in samples])
    anchors_t = torch.cat(anchors)
    labels, valid = block_labels(input_ids, loss_mask, anchors_t, block_size)
    return PackedBatch(torch.cat(feats), input_ids, torch.cat(pos), torch.cat(doc), anchors_t, labels, valid,
                       block_size, len(samples))


def token_budget_groups(samples: Iterable[dict], tokens_per_batch: int) -> Iterator[list[dict]]:
    """Greedy in-order grouping: add samples while the row stays within the budget. A sample longer than the
    budget is truncated to it (its tail cannot host a block anyway once cut) and travels alone."""
    group: list[dict] = []
    used = 0
    for s in samples:
        T = int(s["input_ids"].numel())
        if T > tokens_per_batch:
            s = {**s, "input_ids": s["input_ids"][:tokens_per_batch], "loss_mask": s["loss_mask"][:tokens_per_batch],
                 "features": s["features"][:tokens_per_batch]}
            T = tokens_per_batch
        if group and used + T > tokens_per_batch:
            yield group
            group, used = [], 0
        group.append(s)
        used += T
    if group:
        yield group
