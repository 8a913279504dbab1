"""The target's linear layers on a better CPU kernel for multi-row forwards (verify blocks, prefill).

Stock `F.linear` on CPU multiplies an [M, K] input by the transposed [N, K] weight; for the few rows of a verify
block (M = 2..16) that GEMM runs far below the CPU's rate, and the vocab-wide LM head over every block row
dominates (benchmarks/bench_verify.py: on the SmolLM2-135M target the 8-token forward costs ~1.8x a one-token
step with stock kernels). oneDNN's linear with the weight reordered once into its blocked layout runs those
products of 4 rows or more faster, but one to three rows (the plain decode step, memory-bound) run slower on it,
so `PackedLinear` keeps both and picks by the number of rows. Both decoders
(target alone, speculative) run the same modules, so their comparison stays honest; the price is a second copy
of every linear weight in memory (hence CPU targets only, where the evaluated models are small).
"""

from __future__ import annotations

import os

import torch

# Rows from which the packed kernel wins: measured with benchmarks/bench_verify.py --clock cpu (SmolLM2-135M, 2-core
# AVX-512 Xeon), the stock kernel is cheaper for forwards of 1-3 tokens (1.13x and 1.15x a one-token step at 2 and 3,
# packed 1.37x and 1.42x) and the packed one from 4 (1.42x vs 1.49x at 4, 1.55x vs 1.85x at 8).
PACKED_MIN_ROWS = 4


class PackedLinear(torch.nn.Module):
    """A `torch.nn.Linear` whose calls of PACKED_MIN_ROWS rows or more run oneDNN's linear on a pre-reordered
    weight; fewer rows take the stock kernel."""

    def __init__(self, linear: torch.nn.Linear, rows_hint: int = 8):
        super().__init__()
        self.linear = linear
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows_hint)

    @property
    def weight(self) -> torch.Tensor:  # what code reading `lm_head.weight` (tied embeddings, dtype checks) sees
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() < PACKED_MIN_ROWS:
            return self.linear(x)
        bias = None if self.linear.bias is None else self.linear.bias.detach()
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, bias, "none", [], "")
        return out.reshape(*x.shape[:-1], out.shape[-1])


def packed_kernels_available(model: torch.nn.Module) -> bool:
    """oneDNN is built in and the model is an fp32 CPU model (the reordered fp32 path is what was measured)."""
    param = next(model.parameters())
    return torch.backends.mkldnn.is_available() and param.device.type == "cpu" and param.dtype == torch.float32


def linear_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every `torch.nn.Linear` weight under `model` (what packing copies)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if type(m) is torch.nn.Linear)


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def pack_for_cpu(model: torch.nn.Module, memory_share: float = 0.25) -> str:
    """Pack the target's linears when oneDNN can (packed_kernels_available) and the copy takes at most
    `memory_share` of this machine's memory (a 135M fp32 target: 0.65 GB; an 8B one would not fit twice).
    Returns the kernels the target now runs on, for the metrics: `onednn-packed` or `stock`."""
    if not packed_kernels_available(model) or linear_weight_bytes(model) > memory_share * physical_memory_bytes():
        return "stock"
    pack_linears(model)
    return "onednn-packed"


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every `torch.nn.Linear` under `model` by a PackedLinear, in place (inference only: the packed
    copy does not follow later weight updates). Returns how many were replaced (0 when packed already)."""
    replaced = 0
    for parent in list(model.modules()):
        if isinstance(parent, PackedLinear):  # packed already (a second call)
            continue
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, PackedLinear(child))
                replaced += 1
    return replaced
