"""The target's linear layers on a better CPU kernel for multi-row forwards (verify blocks, prefill).

Stock `F.linear` on CPU multiplies an [M, K] input by the transposed [N, K] weight; for the few rows of a verify
block (M = 2..16) that GEMM runs far below the CPU's rate, and the vocab-wide LM head over every block row
dominates (benchmarks/bench_verify.py: on the SmolLM2-135M target the 8-token forward costs ~1.8x a one-token
step with stock kernels). oneDNN's linear with the weight reordered once into its blocked layout runs those
small-M products ~2x faster, but a one-row product (the plain decode step, memory-bound) runs slower on it, so
`PackedLinear` keeps both: one-row calls take the stock weight, multi-row calls the packed one. Both decoders
(target alone, speculative) run the same modules, so their comparison stays honest; the price is a second copy
of every linear weight in memory (hence CPU targets only, where the evaluated models are small).
"""

from __future__ import annotations

import torch


class PackedLinear(torch.nn.Module):
    """A `torch.nn.Linear` whose multi-row calls run oneDNN's linear on a pre-reordered weight."""

    def __init__(self, linear: torch.nn.Linear, rows_hint: int = 8):
        super().__init__()
        self.linear = linear
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows_hint)

    @property
    def weight(self) -> torch.Tensor:  # what code reading `lm_head.weight` (tied embeddings, dtype checks) sees
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() <= 1:
            return self.linear(x)
        bias = None if self.linear.bias is None else self.linear.bias.detach()
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, bias, "none", [], "")
        return out.reshape(*x.shape[:-1], out.shape[-1])


def packed_kernels_available(model: torch.nn.Module) -> bool:
    """oneDNN is built in and the model is an fp32 CPU model (the reordered fp32 path is what was measured)."""
    param = next(model.parameters())
    return torch.backends.mkldnn.is_available() and param.device.type == "cpu" and param.dtype == torch.float32


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every `torch.nn.Linear` under `model` by a PackedLinear, in place (inference only: the packed
    copy does not follow later weight updates). Returns how many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, PackedLinear(child))
                replaced += 1
    return replaced
