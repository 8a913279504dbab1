"""The DFlash training/inference attention pattern, as a dense boolean mask (SDPA) or a FlexAttention block mask.

Layout of one packed row: keys/values are `[S context positions | N blocks of B slots]`, queries are the N*B block
slots only. A block whose anchor sits at packed index `a` (document `d`) may attend to

* context index `j` iff `j < a` and `doc[j] == d` (position comparison, never block-index comparison, which leaks
  context when anchors overlap), and
* every slot of its own block (bidirectional inside the block).

Inference is the same pattern with one block whose anchor index is S (the newest verified token has no feature).

Sliding-window layers (`window=W`, config `layer_types[i] == "sliding_attention"`, `sliding_window=W`) also drop
keys W or more RoPE positions behind the query, as vLLM runs a non-causal sliding DFlash layer (FlashAttention's
inclusive window `(W-1, W-1)`). Packed-index distances equal RoPE position differences: a block only sees its own
document, whose context is contiguous (batch.py). For the query in slot k of a block anchored at position p:

* context key at position j: visible iff the rule above holds and `(p + k) - j < W` (slot k sees the last `W - k`
  context positions: the window is relative to each query, not to the anchor);
* block slot k': visible iff `|k - k'| < W`, i.e. the whole block whenever B <= W.

The FlexAttention block mask (the GPU path) is never evaluated densely: `block_tiles` derives, per 128 x 128 tile
of (query, key), whether it is empty, partial or full straight from the anchors, document starts and window, in
O(blocks + tiles) memory. Masks are cached on the `BlockLayout`, so every layer and the backward reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention


@dataclass
class BlockLayout:
    """Where the blocks of one packed row sit. All tensors live on the compute device."""

    context_len: int          # S
    block_size: int           # B
    anchor_index: torch.Tensor  # [N] packed index of each anchor; the block sees context j < anchor_index
    context_doc: torch.Tensor | None = None  # [S] document id per context position (packing)
    anchor_doc: torch.Tensor | None = None   # [N] document id per block
    # Masks built from this layout, by (kind, window, ...): one per forward, shared by every layer and the backward.
    masks: dict[tuple, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_blocks(self) -> int:
        return int(self.anchor_index.numel())

    def cached(self, key: tuple, build):
        """`build()` once per key for this layout (masks depend only on the layout and the window)."""
        if key not in self.masks:
            self.masks[key] = build()
        return self.masks[key]

    def doc_start(self) -> torch.Tensor:
        """[N] packed index where each block's document starts (0 without packing). Documents are contiguous
        ranges of the row (batch.py packs samples one after another); `block_tiles` relies on it."""
        if self.context_doc is None:
            return torch.zeros_like(self.anchor_index)
        doc = self.context_doc
        if doc.numel() > 1 and bool((doc[1:] < doc[:-1]).any()):
            raise ValueError("BlockLayout.context_doc must be non-decreasing (each document one contiguous range)")
        starts = torch.searchsorted(doc, self.anchor_doc.to(doc.dtype))
        return starts.to(self.anchor_index.dtype)

    def context_bounds(self, window: int | None, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """([N] first, [N] end) of the context keys that slot `slot` of each block sees: [first, anchor)."""
        lo = self.doc_start()
        if window is not None:
            lo = torch.maximum(lo, self.anchor_index + slot - window + 1)
        return torch.minimum(lo, self.anchor_index), self.anchor_index


def _check_window(window: int | None) -> None:
    if window is not None and window < 1:
        raise ValueError(f"sliding window {window}: must be >= 1 (or None for full attention)")


def dense_mask(layout: BlockLayout, window: int | None = None) -> torch.Tensor:
    """Boolean [N*B, S+N*B] mask, True where attention is allowed (the SDPA convention); `window` = W of a
    sliding-window layer (module docstring), None for full attention."""
    _check_window(window)
    S, B, N = layout.context_len, layout.block_size, layout.num_blocks
    dev = layout.anchor_index.device
    q_idx = torch.arange(N * B, device=dev)
    q_block, q_slot = q_idx // B, q_idx % B
    ctx_ok = torch.arange(S, device=dev)[None, :] < layout.anchor_index[q_block][:, None]
    if layout.context_doc is not None:
        ctx_ok &= layout.context_doc[None, :] == layout.anchor_doc[q_block][:, None]
    blk_ok = q_block[:, None] == q_block[None, :]
    if window is not None:
        q_pos = layout.anchor_index[q_block] + q_slot
        ctx_ok &= (q_pos[:, None] - torch.arange(S, device=dev)[None, :]) < window
        blk_ok &= (q_slot[:, None] - q_slot[None, :]).abs() < window
    return torch.cat([ctx_ok, blk_ok], dim=1)


def allowed_pairs(layout: BlockLayout, window: int | None = None) -> int:
    """Number of allowed (query, key) pairs, `dense_mask(layout, window).sum()` without building the mask (the
    attention FLOPs of a row are proportional to it)."""
    _check_window(window)
    B = layout.block_size
    total = 0
    for k in range(B):
        first, end = layout.context_bounds(window, k)
        visible_slots = B if window is None else sum(1 for j in range(B) if abs(k - j) < window)
        total += int((end - first).sum()) + visible_slots * layout.num_blocks
    return total


def sdpa_attention(q, k, v, layout: BlockLayout, window: int | None = None) -> torch.Tensor:
    """q [1, h, N*B, d]; k, v [1, kv_h, S+N*B, d] -> [1, h, N*B, d] with a dense boolean mask (built once per
    layout and window)."""
    mask = layout.cached(("dense", window, str(q.device)), lambda: dense_mask(layout, window).to(q.device))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def flex_mask_mod(layout: BlockLayout, window: int | None = None):
    """The FlexAttention `mask_mod` of `dense_mask(layout, window)` (same predicate, index arithmetic only)."""
    _check_window(window)
    S, B = layout.context_len, layout.block_size
    anchor = layout.anchor_index
    dev = anchor.device
    pad = layout.num_blocks * B
    if layout.context_doc is not None:
        doc_kv = torch.cat([layout.context_doc, torch.full((pad,), -1, device=dev, dtype=layout.context_doc.dtype)])
        anchor_doc = layout.anchor_doc
    else:
        doc_kv = anchor_doc = None

    def mask_mod(b, h, q_idx, kv_idx):
        q_block, q_slot = q_idx // B, q_idx % B
        is_ctx = kv_idx < S
        ctx_ok = is_ctx & (kv_idx < anchor[q_block])
        if doc_kv is not None:
            ctx_ok = ctx_ok & (doc_kv[kv_idx] == anchor_doc[q_block])
        blk_ok = (~is_ctx) & ((kv_idx - S) // B == q_block)
        if window is not None:
            ctx_ok = ctx_ok & (anchor[q_block] + q_slot - kv_idx < window)
            blk_ok = blk_ok & ((q_slot - (kv_idx - S) % B).abs() < window)
        return ctx_ok | blk_ok

    return mask_mod


TILE = 128  # FlexAttention's default sparse block size (queries and keys)


def _ranges_to_tiles(rows: torch.Tensor, first: torch.Tensor, end: torch.Tensor, num_rows: int, num_cols: int,
                     tile: int) -> torch.Tensor:
    """Bool [num_rows, num_cols]: True where tile column c intersects [first_i, end_i) for some i with row
    rows_i (a difference array over tiles, cumulated: memory O(rows x cols), never O(queries x keys))."""
    keep = end > first
    rows, first, end = rows[keep], first[keep], end[keep]
    diff = torch.zeros(num_rows, num_cols + 1, dtype=torch.int32, device=rows.device)
    ones = torch.ones_like(rows, dtype=torch.int32)
    diff.index_put_((rows, first // tile), ones, accumulate=True)
    diff.index_put_((rows, (end - 1) // tile + 1), -ones, accumulate=True)
    return diff.cumsum(1)[:, :num_cols] > 0


def block_tiles(layout: BlockLayout, q_len: int, kv_len: int, window: int | None = None,
                tile: int = TILE) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full): bool [Q tiles, KV tiles] of `dense_mask(layout, window)` cut into tile x tile squares,
    computed from the layout alone. `full` tiles are allowed everywhere (no mask_mod is evaluated on them);
    `partial` tiles hold at least one allowed pair; the rest are skipped.

    Per block n (anchor a, document start d): slot k sees context keys [max(d, a + k - W + 1), a), so the union
    over its slots is [max(d, a - W + 1), a) and the part every slot sees is [max(d, a + B - W), a); its own
    block's keys are S + nB .. S + nB + B - 1. A query tile is the union of the blocks it holds (a block may
    straddle two tiles when B does not divide the tile), and a context tile is full for it when it lies inside
    every one of its blocks' common part. Tiles that cut the row's end, or the context/block boundary S, are
    never called full (the predicate decides there)."""
    _check_window(window)
    S, B, N = layout.context_len, layout.block_size, layout.num_blocks
    dev = layout.anchor_index.device
    q_tiles, kv_tiles = -(-q_len // tile), -(-kv_len // tile)
    n = torch.arange(N, device=dev)
    first_qt, last_qt = (n * B) // tile, (n * B + B - 1) // tile
    any_first, anchor = layout.context_bounds(window, 0)
    all_first, _ = layout.context_bounds(window, B - 1)
    blk_first, blk_end = S + n * B, S + n * B + B
    rows = torch.cat([first_qt, last_qt, first_qt, last_qt])
    partial = _ranges_to_tiles(rows, torch.cat([any_first, any_first, blk_first, blk_first]),
                               torch.cat([anchor, anchor, blk_end, blk_end]), q_tiles, kv_tiles, tile)
    # per query tile: the latest common-part start and the earliest anchor among its blocks
    big = torch.iinfo(torch.long).max
    lo = torch.full((q_tiles,), -1, dtype=torch.long, device=dev)
    hi = torch.full((q_tiles,), big, dtype=torch.long, device=dev)
    for qt in (first_qt, last_qt):
        lo.scatter_reduce_(0, qt, all_first.long(), "amax")
        hi.scatter_reduce_(0, qt, anchor.long(), "amin")
    start = torch.arange(kv_tiles, device=dev) * tile
    full = (start[None, :] >= lo[:, None]) & (start[None, :] + tile <= torch.minimum(hi, torch.tensor(S, device=dev))
                                              [:, None])
    if q_len % tile:
        full[-1] = False  # the last query tile is cut by the row's end: let the predicate decide
    return partial & ~full, full


def _tile_indices(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool [Q tiles, KV tiles] -> (counts [1, 1, Q], indices [1, 1, Q, KV]) in BlockMask's layout: each row's
    tile ids first, ascending."""
    counts = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[None, None], order[None, None]


def flex_block_mask(layout: BlockLayout, q_len: int, kv_len: int, device, window: int | None = None):
    """The sparse FlexAttention BlockMask of `flex_mask_mod`, built from `block_tiles` (never densely), once per
    layout, size and window."""

    def build():
        partial, full = block_tiles(layout, q_len, kv_len, window)
        kv_num, kv_idx = _tile_indices(partial.to(device))
        full_num, full_idx = _tile_indices(full.to(device))
        return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=TILE,
                                        mask_mod=flex_mask_mod(layout, window), seq_lengths=(q_len, kv_len))

    return layout.cached(("flex", window, q_len, kv_len, str(device)), build)


def flex_attention_fn(q, k, v, layout: BlockLayout, window: int | None = None) -> torch.Tensor:
    """The same pattern through FlexAttention (sparse block mask; the GPU path for long rows)."""
    block_mask = flex_block_mask(layout, q.shape[2], k.shape[2], q.device, window)
    fn = _compiled_flex() if q.device.type == "cuda" else flex_attention
    return fn(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])


@lru_cache(maxsize=1)
def _compiled_flex():
    """Compiled once per process: uncompiled flex materialises the full score matrix (fine only for tests)."""
    return torch.compile(flex_attention, dynamic=True)


def flex_available(device: torch.device | str) -> bool:
    """FlexAttention is the default only on CUDA; on CPU the dense path is faster at our sizes."""
    return torch.device(device).type == "cuda"


def attend(q, k, v, layout: BlockLayout, impl: str = "auto", window: int | None = None) -> torch.Tensor:
    """Dispatch: impl is "sdpa", "flex" or "auto" (flex on CUDA, dense SDPA elsewhere); `window` as in
    `dense_mask`."""
    if impl == "auto":
        impl = "flex" if flex_available(q.device) else "sdpa"
    if impl == "flex":
        return flex_attention_fn(q, k, v, layout, window)
    if impl == "sdpa":
        return sdpa_attention(q, k, v, layout, window)
    raise ValueError(f"attention impl {impl!r}: use auto, sdpa or flex")
