"""Packing samples into one training row: token-budget batching without padding.

Samples are concatenated; each keeps its own RoPE positions (0..T-1) and a document id, so a block only sees
context from its own sample. Anchors are sampled per sample (anchors.py) and shifted to packed indices.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import torch

from flashdraft.drafter.anchors import sample_anchors
from flashdraft.drafter.attention import BlockLayout
from flashdraft.drafter.loss import block_labels
from flashdraft.features.shard import Sample


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


def pack(samples: list[Sample], block_size: int, max_anchors: int, *, seed: int, epoch: int,
         max_tokens: int | None = None) -> PackedBatch:
    """One row from consecutive samples (each truncated to `max_tokens` first, when given)."""
    if max_tokens is not None:
        samples = [truncate(s, max_tokens) for s in samples]
    feats, ids, pos, doc, anchors = [], [], [], [], []
    offset = 0
    for d, s in enumerate(samples):
        T = int(s.input_ids.numel())
        a = sample_anchors(s.loss_mask, block_size, max_anchors, seed=seed, epoch=epoch, sample_id=str(s.sample_id))
        feats.append(s.features)
        ids.append(s.input_ids.long())
        pos.append(torch.arange(T))
        doc.append(torch.full((T,), d, dtype=torch.long))
        anchors.append(a + offset)
        offset += T
    input_ids = torch.cat(ids)
    loss_mask = torch.cat([s.loss_mask.bool() for s in samples])
    anchors_t = torch.cat(anchors)
    labels, valid = block_labels(input_ids, loss_mask, anchors_t, block_size)
    return PackedBatch(torch.cat(feats), input_ids, torch.cat(pos), torch.cat(doc), anchors_t, labels, valid,
                       block_size, len(samples))


def truncate(sample: Sample, max_tokens: int) -> Sample:
    """A sample longer than the row budget keeps its first `max_tokens` tokens (features and mask alike)."""
    if int(sample.input_ids.numel()) <= max_tokens:
        return sample
    return replace(sample, input_ids=sample.input_ids[:max_tokens], loss_mask=sample.loss_mask[:max_tokens],
                   features=sample.features[:max_tokens])


def group_sizes(lengths: Iterable[int], tokens_per_batch: int) -> list[int]:
    """Greedy in-order packing by length only: how many consecutive samples go into each row. Being a function of
    lengths alone, every rank can count its micro-batches (and a resume can find its place) without reading data."""
    sizes: list[int] = []
    count = used = 0
    for T in lengths:
        T = min(int(T), tokens_per_batch)
        if count and used + T > tokens_per_batch:
            sizes.append(count)
            count = used = 0
        count += 1
        used += T
    if count:
        sizes.append(count)
    return sizes


def token_budget_groups(samples: Iterable[Sample], tokens_per_batch: int) -> Iterator[list[Sample]]:
    """The same greedy packing as `group_sizes`, on a live stream of samples (streaming mode)."""
    group: list[Sample] = []
    used = 0
    for s in samples:
        s = truncate(s, tokens_per_batch)
        T = int(s.input_ids.numel())
        if group and used + T > tokens_per_batch:
            yield group
            group, used = [], 0
        group.append(s)
        used += T
    if group:
        yield group
