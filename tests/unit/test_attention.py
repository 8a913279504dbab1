"""Dense-mask SDPA and FlexAttention implement the same DFlash pattern (flex runs eagerly on CPU in torch 2.13)."""

from __future__ import annotations

import pytest
import torch

from flashdraft.drafter.attention import BlockLayout, attend, dense_mask


def test_dense_mask_by_position_comparison():
    lay = BlockLayout(6, 2, torch.tensor([2, 3]))
    m = dense_mask(lay)
    assert m.shape == (4, 10)
    assert m[0, :6].tolist() == [True, True, False, False, False, False]
    assert m[2, :6].tolist() == [True, True, True, False, False, False]  # overlapping anchor 3 sees 0..2
    assert m[0, 6:].tolist() == [True, True, False, False] and m[3, 6:].tolist() == [False, False, True, True]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_agrees_with_dense_sdpa_with_packing():
    torch.manual_seed(0)
    S, B = 40, 4
    doc = torch.tensor([0] * 15 + [1] * 25)
    anchors = torch.tensor([3, 9, 10, 17, 30])
    lay = BlockLayout(S, B, anchors, doc, doc[anchors])
    q = torch.randn(1, 4, 5 * B, 16)
    k = torch.randn(1, 2, S + 5 * B, 16)
    v = torch.randn(1, 2, S + 5 * B, 16)
    a = attend(q, k, v, lay, "sdpa")
    b = attend(q, k, v, lay, "flex")  # forward only: flex has no CPU backward in torch 2.13
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # a wrong mask must be detectable: drop the document ids and the outputs differ
    c = attend(q, k, v, BlockLayout(S, B, anchors), "flex")
    assert not torch.allclose(a, c, atol=1e-3)
