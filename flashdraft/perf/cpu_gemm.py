"""GEMMs with bf16/fp16 weights on CPUs that have no native bf16 arithmetic.

Why: on AVX2 cores (no AVX512-BF16, no AMX) torch's bf16 GEMMs run several times slower than fp32 ones, while a
whole fp32 copy of a production-width weight doubles its memory. So a narrow weight is upcast SLAB_ROWS output
rows at a time, multiplied in fp32 and dropped: the exact fp32 values of the stored weights, fp32 accumulation (as
bf16 GEMMs accumulate), never a whole copy. Upcasting pays only when enough rows share it (`MIN_ROWS`), so a
decode token keeps the native bf16 GEMM. Measurements: docs/rehearsal.md ("bf16 on AVX2 cores").

Used by the drafter's frozen LM head (loss and logits) and, through `upcast_for_cpu`, by the target's linear and
convolution layers in the CPU stages (generate, extract, evaluate) of a bf16 target (the full-width rehearsal).
"""

from __future__ import annotations

import torch

SLAB_ROWS = 16384  # weight rows upcast at a time (335 MB in fp32 at 5120 wide)
MIN_ROWS = 16      # input rows from which an upcast linear computes in fp32 (below: the native narrow GEMM)


_scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _slabs(w: torch.Tensor, dt: torch.dtype, autograd: bool):
    """(row offset, `w`'s next SLAB_ROWS rows in `dt`). Outside autograd the slabs are written into one reused
    scratch buffer: a fresh 335 MB allocation a slab is page faults, ~3x the cost of the conversion itself. Under
    autograd each slab is its own tensor (autograd may keep it)."""
    for v in range(0, w.shape[0], SLAB_ROWS):
        rows = w[v:v + SLAB_ROWS]
        if autograd:
            yield v, rows.to(dt)
            continue
        key = (dt, rows.device)
        if key not in _scratch or _scratch[key].numel() < rows.numel():
            # a normal tensor even when first needed under inference_mode: an inference tensor could not be
            # written to outside it (the next training step's loss)
            with torch.inference_mode(False):
                _scratch[key] = torch.empty(min(SLAB_ROWS, w.shape[0]) * w.shape[1], dtype=dt, device=rows.device)
        yield v, _scratch[key][:rows.numel()].view(rows.shape).copy_(rows)


def upcast_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`x [..., H] @ w[V, H].T` in the wider of the two dtypes; a narrower `w` is upcast SLAB_ROWS rows at a
    time (exact), never copied whole."""
    dt = torch.promote_types(x.dtype, w.dtype)
    if w.dtype == dt:
        return x.to(dt) @ w.T
    out = x.new_empty((*x.shape[:-1], w.shape[0]), dtype=dt)
    xs = x.to(dt)
    for v, slab in _slabs(w, dt, torch.is_grad_enabled() and x.requires_grad):
        out[..., v:v + slab.shape[0]] = xs @ slab.T
    return out


def upcast_matmul_t(g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`g [M, V] @ w [V, H]` (a gradient back through `w`), upcasting `w` like `upcast_matmul`."""
    dt = torch.promote_types(g.dtype, w.dtype)
    if w.dtype == dt:
        return g.to(dt) @ w
    out = g.new_zeros((g.shape[0], w.shape[1]), dtype=dt)
    for v, slab in _slabs(w, dt, torch.is_grad_enabled() and g.requires_grad):
        out += g[:, v:v + slab.shape[0]].to(dt) @ slab
    return out


def native_narrow_gemm() -> bool:
    """Whether this CPU runs bf16 GEMMs natively (AVX512-BF16 or AMX), so upcasting would only cost time."""
    cap = torch.backends.cpu.get_cpu_capability().upper()
    return "AMX" in cap or "BF16" in cap


def _upcast_linear_forward(linear: torch.nn.Linear):
    def forward(x: torch.Tensor) -> torch.Tensor:
        w = linear.weight
        if x.device.type != "cpu" or x.numel() < MIN_ROWS * x.shape[-1] or torch.is_grad_enabled():
            return torch.nn.functional.linear(x, w, linear.bias)
        out = upcast_matmul(x.float(), w)
        if linear.bias is not None:
            out += linear.bias.float()
        return out.to(x.dtype)
    return forward


def _fp32_conv_forward(conv: torch.nn.Conv1d):
    forward = conv.forward

    def fp32_forward(x: torch.Tensor) -> torch.Tensor:
        return forward(x.to(conv.weight.dtype)).to(x.dtype)
    return fp32_forward


def upcast_for_cpu(model: torch.nn.Module) -> int:
    """On a CPU without native bf16 GEMMs, make `model`'s bf16/fp16 layers compute in fp32 where that is faster:
    `nn.Linear` layers multiply inputs of at least MIN_ROWS rows in fp32 slabs (`upcast_matmul`) in inference (no
    grad; training keeps autograd's GEMMs); `nn.Conv1d` weights (a hybrid's depthwise convolutions: kilobytes)
    are kept in fp32, because a bf16 depthwise conv1d runs ~100x slower than fp32 there (docs/rehearsal.md).
    Outputs keep the layer's
    dtype (transformers' convolution helpers cast to the weight's dtype and back). Returns how many layers were
    switched (0 on a GPU or a bf16-capable CPU)."""
    if native_narrow_gemm():
        return 0
    switched = 0
    for m in model.modules():
        narrow = isinstance(m, (torch.nn.Linear, torch.nn.Conv1d)) and m.weight.device.type == "cpu" \
            and m.weight.dtype in (torch.bfloat16, torch.float16)
        if narrow and isinstance(m, torch.nn.Linear):
            m.forward = _upcast_linear_forward(m)
            switched += 1
        elif narrow:
            m.float()
            m.forward = _fp32_conv_forward(m)
            switched += 1
    return switched


def measure_gemm_flops(rows: int = 512, width: int = 1024, repeats: int = 8) -> float:
    """This machine's fp32 GEMM rate in FLOP/s with torch's current thread count: the best of `repeats`
    [rows x width] @ [width x width] products after one warm-up. Why: a stage's achieved FLOP/s says how far from
    the machine's limit it runs only against what this CPU does at best (the generate stage's `gemm_share`)."""
    import time

    x, w = torch.randn(rows, width), torch.randn(width, width)
    torch.nn.functional.linear(x, w)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * rows * width * width / best
