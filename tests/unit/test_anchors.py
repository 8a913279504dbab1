"""Anchor eligibility and the seeded per-epoch draw."""

from __future__ import annotations

import torch

from flashdraft.drafter.anchors import eligible_anchors, sample_anchors


def test_eligible_anchors_need_two_response_tokens_and_room_for_the_block():
    lm = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
    assert eligible_anchors(lm, 4).tolist() == [2, 3, 6, 7]  # a < 12 - 4, lm[a] & lm[a+1]
    assert eligible_anchors(lm[:4], 4).tolist() == []


def test_sampling_is_seeded_per_epoch_and_sorted():
    lm = torch.ones(300, dtype=torch.bool)
    a0 = sample_anchors(lm, 16, 32, seed=0, epoch=0, sample_id="s1")
    assert a0.numel() == 32 and torch.equal(a0, a0.sort().values) and a0.unique().numel() == 32
    assert int(a0.max()) < 300 - 16
    assert torch.equal(a0, sample_anchors(lm, 16, 32, seed=0, epoch=0, sample_id="s1"))
    assert not torch.equal(a0, sample_anchors(lm, 16, 32, seed=0, epoch=1, sample_id="s1"))
    assert not torch.equal(a0, sample_anchors(lm, 16, 32, seed=0, epoch=0, sample_id="s2"))
    assert sample_anchors(lm[:40], 16, 512, seed=0, epoch=0, sample_id="x").tolist() == list(range(24))
