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


# -- sliding-window layers ------------------------------------------------------------------------------------


def _reference_mask(ctx_pos, ctx_doc, anchor_index, B, window):
    """The window definition written out one (query, key) pair at a time, in RoPE positions: the dense reference."""
    S, N = len(ctx_pos), len(anchor_index)
    m = torch.zeros(N * B, S + N * B, dtype=torch.bool)
    for n in range(N):
        for k in range(B):
            q, qpos = n * B + k, ctx_pos[anchor_index[n]] + k
            for j in range(S):
                ok = j < anchor_index[n] and ctx_doc[j] == ctx_doc[anchor_index[n]]
                m[q, j] = ok and (window is None or qpos - ctx_pos[j] < window)
            for k2 in range(B):
                m[q, S + n * B + k2] = window is None or abs(k - k2) < window
    return m


DOC = torch.tensor([0] * 23 + [1] * 37)
POS = torch.cat([torch.arange(23), torch.arange(37)])  # RoPE positions restart in each packed document


def _packed_layout():
    """Two packed documents, overlapping anchors, one anchor right at a document boundary."""
    anchors = torch.tensor([4, 9, 10, 20, 23, 24, 40, 55])
    return BlockLayout(60, 4, anchors, DOC, DOC[anchors])


def test_window_pinned_by_hand():
    """Block anchored at 8 (positions 8, 9, 10), W=4: slot k sees context positions > 8 + k - 4."""
    lay = BlockLayout(10, 3, torch.tensor([8]))
    m = dense_mask(lay, window=4)
    assert [row[:10].nonzero().flatten().tolist() for row in m] == [[5, 6, 7], [6, 7], [7]]
    assert m[:, 10:].all()  # B <= W: the whole block
    m = dense_mask(lay, window=2)
    assert [row[:10].nonzero().flatten().tolist() for row in m] == [[7], [], []]
    assert m[:, 10:].int().tolist() == [[1, 1, 0], [1, 1, 1], [0, 1, 1]]  # |k - k'| < 2
    with pytest.raises(ValueError, match="sliding window 0"):
        dense_mask(lay, window=0)


@pytest.mark.parametrize("window", [None, 1, 3, 7, 16, 1000])
def test_dense_and_flex_masks_equal_the_reference(window):
    from torch.nn.attention.flex_attention import create_mask

    from flashdraft.drafter.attention import flex_mask_mod

    lay = _packed_layout()
    ref = _reference_mask(POS.tolist(), DOC.tolist(), lay.anchor_index.tolist(), lay.block_size, window)
    assert torch.equal(dense_mask(lay, window), ref)
    Q, KV = ref.shape
    flex = create_mask(flex_mask_mod(lay, window), None, None, Q, KV, device="cpu")[0, 0]
    assert torch.equal(flex, ref)


def test_window_reaches_full_attention_only_past_the_longest_distance():
    lay = _packed_layout()  # the farthest pair: slot 3 of the anchor at position 32 (doc 1) to position 0
    assert torch.equal(dense_mask(lay, 36), dense_mask(lay))
    assert not torch.equal(dense_mask(lay, 35), dense_mask(lay))


def test_flex_block_mask_skips_exactly_the_empty_tiles():
    """The sparse BlockMask (128x128 tiles) keeps a tile iff the dense mask has an allowed pair in it."""
    from flashdraft.drafter.attention import flex_block_mask

    S, B, W = 700, 16, 64
    anchors = torch.arange(40, 680, 20)
    lay = BlockLayout(S, B, anchors)
    Q, KV = len(anchors) * B, S + len(anchors) * B
    dense = dense_mask(lay, W)
    tiles = torch.nn.functional.pad(dense, (0, -KV % 128, 0, -Q % 128)).reshape(
        -(-Q // 128), 128, -(-KV // 128), 128).any(3).any(1)
    kept = flex_block_mask(lay, Q, KV, "cpu", W).to_dense()[0, 0].bool()
    assert torch.equal(kept, tiles)
    assert kept.sum() < flex_block_mask(lay, Q, KV, "cpu").to_dense()[0, 0].bool().sum()  # the window prunes


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_agrees_with_dense_sdpa_with_window():
    torch.manual_seed(1)
    lay = _packed_layout()
    N, B, S = lay.num_blocks, lay.block_size, lay.context_len
    q, k, v = torch.randn(1, 4, N * B, 16), torch.randn(1, 2, S + N * B, 16), torch.randn(1, 2, S + N * B, 16)
    a = attend(q, k, v, lay, "sdpa", window=6)
    torch.testing.assert_close(a, attend(q, k, v, lay, "flex", window=6), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a, attend(q, k, v, lay, "sdpa"), atol=1e-3)


# -- the block mask built from the layout (never densely) -----------------------------------------------------


def _random_packed_layout(seed: int, B: int, docs: int = 3, doc_len=(150, 500)):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(doc_len[0], doc_len[1], (docs,), generator=g).tolist()
    doc = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])
    anchors = torch.cat([torch.randperm(n - B, generator=g)[: max(1, n // 9)].sort().values + sum(lengths[:d])
                         for d, n in enumerate(lengths)])
    return BlockLayout(len(doc), B, anchors, doc, doc[anchors])


def _dense_tiles(dense: torch.Tensor, tile: int = 128):
    Q, KV = dense.shape
    inside = torch.nn.functional.pad(torch.ones_like(dense), (0, -KV % tile, 0, -Q % tile))
    padded = torch.nn.functional.pad(dense, (0, -KV % tile, 0, -Q % tile))
    shape = (-(-Q // tile), tile, -(-KV // tile), tile)
    any_ = padded.reshape(shape).any(3).any(1)
    full = (padded | ~inside).reshape(shape).all(3).all(1) & inside.reshape(shape).all(3).all(1)
    return any_, full


@pytest.mark.parametrize("B,window,seed", [(16, None, 0), (16, 2048, 1), (16, 100, 2), (8, 37, 3), (6, 300, 4),
                                           (16, 5, 5)])
def test_block_tiles_equal_the_dense_mask_tiles(B, window, seed):
    """Every tile with an allowed pair is kept; a tile called full is allowed everywhere; and when the block size
    divides the tile, every full context tile away from the row's edges is found (none is left to the predicate)."""
    from flashdraft.drafter.attention import block_tiles

    lay = _random_packed_layout(seed, B)
    dense = dense_mask(lay, window)
    Q, KV = dense.shape
    partial, full = block_tiles(lay, Q, KV, window)
    any_, exact_full = _dense_tiles(dense)
    assert not bool((partial & full).any())
    assert torch.equal(partial | full, any_)
    assert not bool((full & ~exact_full).any())
    if 128 % B == 0:
        ctx_tiles = (torch.arange(any_.shape[1]) + 1) * 128 <= lay.context_len
        expected = exact_full & ctx_tiles[None, :]
        if Q % 128:
            expected[-1] = False
        assert torch.equal(full, expected)
        assert int(full.sum()) > 0 or window is not None and window < 128


@pytest.mark.parametrize("window", [None, 1, 3, 40, 5000])
def test_allowed_pairs_counts_the_dense_mask(window):
    from flashdraft.drafter.attention import allowed_pairs

    for lay in (_packed_layout(), _random_packed_layout(7, 16), BlockLayout(10, 3, torch.tensor([8]))):
        assert allowed_pairs(lay, window) == int(dense_mask(lay, window).sum())


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("window", [None, 200])
def test_flex_from_layout_tiles_agrees_with_dense_sdpa_over_many_tiles(window):
    """Full tiles skip the predicate: their outputs must still equal the dense reference (forward, CPU)."""
    torch.manual_seed(2)
    lay = _random_packed_layout(11, 16, docs=2, doc_len=(300, 420))
    N, B, S = lay.num_blocks, lay.block_size, lay.context_len
    q, k, v = torch.randn(1, 4, N * B, 16), torch.randn(1, 2, S + N * B, 16), torch.randn(1, 2, S + N * B, 16)
    a = attend(q, k, v, BlockLayout(S, B, lay.anchor_index, lay.context_doc, lay.anchor_doc), "sdpa", window)
    torch.testing.assert_close(a, attend(q, k, v, lay, "flex", window), atol=1e-5, rtol=1e-5)


def test_masks_are_built_once_per_layout_and_window(monkeypatch):
    """A forward through several layers builds each window's mask once and every layer reuses it."""
    from flashdraft.drafter import attention

    calls = []
    real = attention.dense_mask
    monkeypatch.setattr(attention, "dense_mask", lambda lay, window=None: calls.append(window) or real(lay, window))
    lay = _packed_layout()
    N, B, S = lay.num_blocks, lay.block_size, lay.context_len
    q, k, v = torch.randn(1, 4, N * B, 16), torch.randn(1, 2, S + N * B, 16), torch.randn(1, 2, S + N * B, 16)
    for window in (None, 6, None, 6, 6):
        attend(q, k, v, lay, "sdpa", window)
    assert sorted(calls, key=str) == [6, None]
    attend(q, k, v, _packed_layout(), "sdpa", 6)  # a new row (layout) builds its own
    assert len(calls) == 3
