"""The drafter's decoder layer: Qwen3-style attention and MLP, with the fused target context injected as extra
keys/values. Each layer projects the context with its OWN k_proj/v_proj (+ k_norm, RoPE at the context positions)
and puts it before the block's keys/values; queries come from the block's tokens only. DFlash2 wraps both
sublayers in block convolutions (dflash2.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from flashdraft.drafter.attention import BlockLayout, attend
from flashdraft.drafter.dflash2 import BlockConv
from flashdraft.drafter.geometry import DrafterGeometry


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class DFlashAttention(nn.Module):
    def __init__(self, g: DrafterGeometry, window: int | None = None):
        super().__init__()
        self.nh, self.nkv, self.hd = g.num_heads, g.num_kv_heads, g.head_dim
        self.window = window  # sliding window of this layer (None: full attention)
        self.q_proj = nn.Linear(g.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(g.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(g.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, g.hidden_size, bias=False)
        self.q_norm = nn.RMSNorm(self.hd, eps=g.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.hd, eps=g.rms_norm_eps)

    def project_kv(self, h, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """h [1, L, H] -> (keys with RoPE, values), each [1, kv_heads, L, head_dim]."""
        L = h.shape[1]
        k = self.k_norm(self.k_proj(h).view(1, L, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(h).view(1, L, self.nkv, self.hd).transpose(1, 2)
        return _rope(k, *rope), v

    def forward(self, x, ctx, rope_q, rope_kv, layout: BlockLayout, impl: str, ctx_kv=None):
        """ctx_kv: the context's (keys, values) already projected (ContextCache); rope_kv then covers x only."""
        Q = x.shape[1]
        q = _rope(self.q_norm(self.q_proj(x).view(1, Q, self.nh, self.hd)).transpose(1, 2), *rope_q)
        if ctx_kv is None:
            k, v = self.project_kv(torch.cat([ctx, x], dim=1), rope_kv)
        else:
            k_x, v_x = self.project_kv(x, rope_kv)
            k, v = torch.cat([ctx_kv[0], k_x], dim=2), torch.cat([ctx_kv[1], v_x], dim=2)
        out = attend(q, k, v.to(q.dtype), layout, impl, self.window)
        return self.o_proj(out.transpose(1, 2).reshape(1, Q, self.nh * self.hd))


class DFlashMLP(nn.Module):
    def __init__(self, g: DrafterGeometry):
        super().__init__()
        self.gate_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.up_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.down_proj = nn.Linear(g.intermediate_size, g.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


ACTIVATION_CHECKPOINTING = ("none", "mlp", "layer")


class DFlashLayer(nn.Module):
    def __init__(self, g: DrafterGeometry, index: int = 0):
        super().__init__()
        self.self_attn = DFlashAttention(g, g.window(index))
        self.mlp = DFlashMLP(g)
        self.input_layernorm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.recompute = "none"  # training.activation_checkpointing (set by the trainer)
        if g.is_dflash2:  # DFlash2: block convolutions around both sublayers (dflash2.py)
            self.attention_conv = BlockConv(g.hidden_size, g.conv_kernel_size, g.conv_group_size)
            self.mlp_conv = BlockConv(g.hidden_size, g.conv_kernel_size, g.conv_group_size)
        else:
            self.attention_conv = self.mlp_conv = None

    def forward(self, x, ctx, rope_q, rope_kv, layout: BlockLayout, impl: str, ctx_kv=None):
        if self.recompute == "layer" and torch.is_grad_enabled():
            return checkpoint(self._forward, x, ctx, rope_q, rope_kv, layout, impl, ctx_kv, use_reentrant=False)
        return self._forward(x, ctx, rope_q, rope_kv, layout, impl, ctx_kv)

    def _forward(self, x, ctx, rope_q, rope_kv, layout: BlockLayout, impl: str, ctx_kv=None):
        """x [1, N*B, H]: whole blocks. DFlash2: the context keys/values come from `ctx` unconvolved (as vLLM's
        precomputed context KV); the convolutions act on the block rows only."""
        if self.attention_conv is None:
            x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_kv, layout, impl, ctx_kv)
            h = self.post_attention_layernorm(x)
            if self.recompute == "mlp" and torch.is_grad_enabled():
                return x + checkpoint(self.mlp, h, use_reentrant=False)
            return x + self.mlp(h)
        B = layout.block_size
        h, delta = self.attention_conv.prepare(self.input_layernorm(x), B)
        x = x + self.attention_conv.finish(self.self_attn(h, ctx, rope_q, rope_kv, layout, impl, ctx_kv), delta, B)
        h, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x), B)
        if self.recompute == "mlp" and torch.is_grad_enabled():
            return x + self.mlp_conv.finish(checkpoint(self.mlp, h, use_reentrant=False), delta, B)
        return x + self.mlp_conv.finish(self.mlp(h), delta, B)
