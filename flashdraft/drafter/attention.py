"""The DFlash training/inference attention pattern, as a dense boolean mask (SDPA) or a FlexAttention block mask.

Layout of one packed row: keys/values are `[S context positions | N blocks of B slots]`, queries are the N*B block
slots only. A block whose anchor sits at packed index `a` (document `d`) may attend to

* context index `j` iff `j < a` and `doc[j] == d` (position comparison, never block-index comparison, which leaks
  context when anchors overlap), and
* every slot of its own block (bidirectional inside the block).

Inference is the same pattern with one block whose anchor index is S (the newest verified token has no feature).

Sliding-window layers (`window=W`, config `layer_types[i] == "sliding_attention"`, `sliding_window=W`) keep all of
the above and additionally drop keys that are W or more positions behind the query, measured in RoPE positions
(per document), exactly as vLLM runs a non-causal sliding DFlash layer (per-layer `sliding_window` handed to its
attention backend as FlashAttention's inclusive window `(W-1, W-1)`, context K/V written at their positions, block
queries at `anchor + k`). Distances are measured in packed indices, which equal RoPE position differences: a
block only sees its own document, whose context is contiguous with positions 0..T-1 (batch.py), and at inference
index == position. For the query in slot k of a block anchored at position p (position p + k):

* context key at position j: visible iff the rule above holds and `(p + k) - j < W`, so slot k sees the last
  `W - k` context positions (every slot sees at most W keys behind-or-at its own position, itself included);
* block slot k': visible iff `|k - k'| < W`, i.e. the whole block whenever B <= W (the practical case).

The window is relative to each query, not to the anchor: later slots of a block see slightly less context.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F


@dataclass
class BlockLayout:
    """Where the blocks of one packed row sit. All tensors live on the compute device."""

    context_len: int          # S
    block_size: int           # B
    anchor_index: torch.Tensor  # [N] packed index of each anchor; the block sees context j < anchor_index
    context_doc: torch.Tensor | None = None  # [S] document id per context position (packing)
    anchor_doc: torch.Tensor | None = None   # [N] document id per block

    @property
    def num_blocks(self) -> int:
        return int(self.anchor_index.numel())


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


def sdpa_attention(q, k, v, layout: BlockLayout, window: int | None = None) -> torch.Tensor:
    """q [1, h, N*B, d]; k, v [1, kv_h, S+N*B, d] -> [1, h, N*B, d] with a dense boolean mask."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(layout, window),
                                          enable_gqa=q.shape[1] != k.shape[1])


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


def flex_block_mask(layout: BlockLayout, q_len: int, kv_len: int, device, window: int | None = None):
    """The sparse FlexAttention BlockMask of `flex_mask_mod` (tiles that are fully masked are skipped)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(flex_mask_mod(layout, window), B=None, H=None, Q_LEN=q_len, KV_LEN=kv_len,
                             device=device)


def flex_attention_fn(q, k, v, layout: BlockLayout, window: int | None = None) -> torch.Tensor:
    """The same pattern through FlexAttention (sparse block mask; the GPU path for long rows)."""
    from torch.nn.attention.flex_attention import flex_attention

    block_mask = flex_block_mask(layout, q.shape[2], k.shape[2], q.device, window)
    fn = _compiled_flex() if q.device.type == "cuda" else flex_attention
    return fn(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])


@lru_cache(maxsize=1)
def _compiled_flex():
    """Compiled once per process: uncompiled flex materialises the full score matrix (fine only for tests)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def flex_available(device: torch.device | str) -> bool:
    """FlexAttention is the default only on CUDA; on CPU the dense path is faster at our sizes."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
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
