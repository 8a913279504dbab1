"""The DFlash training/inference attention pattern, as a dense boolean mask (SDPA) or a FlexAttention block mask.

Layout of one packed row: keys/values are `[S context positions | N blocks of B slots]`, queries are the N*B block
slots only. A block whose anchor sits at packed index `a` (document `d`) may attend to

* context index `j` iff `j < a` and `doc[j] == d` (position comparison, never block-index comparison, which leaks
  context when anchors overlap), and
* every slot of its own block (bidirectional inside the block).

Inference is the same pattern with one block whose anchor index is S (the newest verified token has no feature).
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


def dense_mask(layout: BlockLayout) -> torch.Tensor:
    """Boolean [N*B, S+N*B] mask, True where attention is allowed (the SDPA convention)."""
    S, B, N = layout.context_len, layout.block_size, layout.num_blocks
    dev = layout.anchor_index.device
    q_block = torch.arange(N * B, device=dev) // B
    ctx_ok = torch.arange(S, device=dev)[None, :] < layout.anchor_index[q_block][:, None]
    if layout.context_doc is not None:
        ctx_ok &= layout.context_doc[None, :] == layout.anchor_doc[q_block][:, None]
    blk_ok = q_block[:, None] == q_block[None, :]
    return torch.cat([ctx_ok, blk_ok], dim=1)


def sdpa_attention(q, k, v, layout: BlockLayout) -> torch.Tensor:
    """q [1, h, N*B, d]; k, v [1, kv_h, S+N*B, d] -> [1, h, N*B, d] with a dense boolean mask."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(layout), enable_gqa=q.shape[1] != k.shape[1])


def _flex_mask_mod(layout: BlockLayout):
    S, B = layout.context_len, layout.block_size
    anchor = layout.anchor_index
    dev = anchor.device
    if layout.context_doc is not None:
        doc_kv = torch.cat([layout.context_doc, torch.full((layout.num_blocks * B,), -1, device=dev,
                                                            dtype=layout.context_doc.dtype)])
        anchor_doc = layout.anchor_doc
    else:
        doc_kv = anchor_doc = None

    def mask_mod(b, h, q_idx, kv_idx):
        q_block = q_idx // B
        is_ctx = kv_idx < S
        ctx_ok = is_ctx & (kv_idx < anchor[q_block])
        if doc_kv is not None:
            ctx_ok = ctx_ok & (doc_kv[kv_idx] == anchor_doc[q_block])
        blk_ok = (~is_ctx) & ((kv_idx - S) // B == q_block)
        return ctx_ok | blk_ok

    return mask_mod


def flex_attention_fn(q, k, v, layout: BlockLayout) -> torch.Tensor:
    """The same pattern through FlexAttention (sparse block mask; the GPU path for long rows)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = create_block_mask(_flex_mask_mod(layout), B=None, H=None, Q_LEN=q.shape[2], KV_LEN=k.shape[2],
                                   device=q.device)
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


def attend(q, k, v, layout: BlockLayout, impl: str = "auto") -> torch.Tensor:
    """Dispatch: impl is "sdpa", "flex" or "auto" (flex on CUDA, dense SDPA elsewhere)."""
    if impl == "auto":
        impl = "flex" if flex_available(q.device) else "sdpa"
    if impl == "flex":
        return flex_attention_fn(q, k, v, layout)
    if impl == "sdpa":
        return sdpa_attention(q, k, v, layout)
    raise ValueError(f"attention impl {impl!r}: use auto, sdpa or flex")
