"""The DFlash loss: weighted cross-entropy over block slots 1..B-1, computed without materialising the full
[slots x vocab] logits.

* Labels: slot k (1..B-1) of the block anchored at `a` predicts the data token at `a + k`; slot 0 (the anchor
  itself) is never trained, so its logits are never computed.
* Weights (`drafter.loss_weights`); slots whose label is not a response token (`loss_mask = 0`) get weight 0:
  - "decay" (the DFlash paper): `w_k = exp(-(k-1)/gamma)`, fixed.
  - "dpace" (D-PACE, arXiv 2605.18810; speculators, Model-Optimizer and SpecForge agree on it): per block, from the
    drafter's own CE of each slot, `q~_j = (1 - alpha) exp(-CE_j) + alpha`, `C_j` = product of `q~_i` over valid
    `i <= j`, `w_j` = sum of `C_m` over valid `m >= j`: the expected number of tokens a hit at slot j lets through,
    so slots the drafter can reach count more. Stop-gradient: the weights are computed from the CE of the same
    chunked pass after it ends (`_FusedLinearCE`), and the per-row gradient formed during the pass is scaled by
    them, so D-PACE costs no second GEMM pass and no vocab-sized tensor.
* Normalisation (`drafter.loss_normalization`; the paper does not say which it uses):
  - "weights" (default, SpecForge's decay, Model-Optimizer's D-PACE): `sum(w * ce) / sum(w)` over valid slots: a
    weighted mean, so the loss scale does not depend on gamma, on how confident the drafter is (D-PACE's w_1 grows
    towards B-1 as it learns) or on how many late slots are valid; one lr and grad clip serve both weightings.
  - "mask" (speculators): `sum(w * ce) / count(valid slots)`.
  The loss is normalised per micro-batch; gradient accumulation and DDP then average micro-batches/ranks.
* Memory/time: `fused_linear_cross_entropy` walks the slots in chunks of ~2**26 logits; per chunk it forms the
  logits once, takes one max pass (stabiliser and argmax for accuracy), exponentiates in place, and immediately
  computes the gradient w.r.t. the hidden states `(softmax - onehot) * w @ W`, so the vocab-sized tensor of a
  chunk dies before the next one and backward is a single multiply. The LM head is frozen, so no weight gradient.
  On CUDA the per-chunk softmax, cross-entropy and gradient run as one compiled function (`_softmax_grad`), fewer
  passes over the chunk's logits than the eager arithmetic; CPU keeps the eager in-place arithmetic (no compiler
  needed, smallest memory).
* GEMM dtype: the head's on CUDA (bf16 GEMMs, fp32 accumulate). On CPU the wider of hidden and head: a bf16 head
  (memory-mapped, production storage) is upcast a slice of rows at a time (flashdraft/perf/cpu_gemm.py), because CPUs
  without native bf16 GEMMs run them much slower than fp32 and a whole fp32 copy of a large head is gigabytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from flashdraft.perf.cpu_gemm import upcast_matmul, upcast_matmul_t

CHUNK_ELEMENTS = 2**26


def slot_weights(block_size: int, gamma: float, device=None, dtype=torch.float32) -> torch.Tensor:
    """[B-1] weights for slots 1..B-1 (computed in float64, then cast)."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float64)
    return torch.exp(-(k - 1) / gamma).to(dtype)


def dpace_weights(ce: torch.Tensor, valid: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE weights [N, B-1] of the drafted slots (module docstring) from their CE [N, B-1] and valid [N, B-1];
    masked slots weigh 0 and are skipped in the running product, so a masked slot equals a deleted one. No grad."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"drafter.dpace_alpha={alpha}: must be in (0, 1]")
    valid = valid.bool()
    q = ((1.0 - alpha) * torch.exp(-ce.detach()) + alpha).masked_fill(~valid, 1.0)
    reach = q.cumprod(dim=1) * valid
    return reach.flip(1).cumsum(1).flip(1) * valid


def block_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels [N, B-1], valid [N, B-1]): slot k's label is input_ids[anchor + k], valid where it is a response
    token. Anchors must satisfy anchor + B - 1 < len(input_ids) (anchors.py guarantees it)."""
    idx = anchors[:, None] + torch.arange(1, block_size, device=anchors.device)[None, :]
    return input_ids[idx], loss_mask[idx].bool()


def _softmax_grad(logits: torch.Tensor, labels: torch.Tensor, row_weight: torch.Tensor):
    """One chunk's (CE [c] fp32, argmax == label [c], d(sum w * CE)/d(logits) [c, V] in the logits' dtype), all
    arithmetic in fp32. Written as whole-tensor expressions for the compiler to fuse (CUDA path)."""
    x = logits.float()
    mx, am = x.max(dim=-1)
    target = x.gather(1, labels[:, None]).squeeze(1)
    e = (x - mx[:, None]).exp()
    total = e.sum(dim=-1)
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == labels[:, None]
    grad = e * (row_weight / total)[:, None] - onehot * row_weight[:, None]
    return mx + total.log() - target, am == labels, grad.to(logits.dtype)


@lru_cache(maxsize=1)
def _compiled_softmax_grad():
    return torch.compile(_softmax_grad, dynamic=True)


def _chunk_fn(hidden: torch.Tensor):
    """The fused per-chunk function where it pays (CUDA, training), else None (the eager in-place loop)."""
    return _compiled_softmax_grad() if hidden.is_cuda and hidden.requires_grad else None


class _FusedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, row_weight, chunk, top_k):
        """`row_weight` [M], or a function of the per-row CE [M] giving it (D-PACE): then the chunks form the
        unit-weight gradient and it is scaled by the weights once every row's CE is known."""
        weigh = row_weight if callable(row_weight) else None
        if weigh is not None:
            row_weight = torch.ones(hidden.shape[0], device=hidden.device,
                                    dtype=torch.promote_types(hidden.dtype, torch.float32))
        needs_grad = hidden.requires_grad
        M = hidden.shape[0]
        acc_dtype = torch.promote_types(hidden.dtype, torch.float32)  # fp32 softmax/CE even for bf16 GEMMs
        ce = torch.empty(M, device=hidden.device, dtype=acc_dtype)
        correct = torch.empty(M, device=hidden.device, dtype=torch.bool)
        grad = torch.empty_like(hidden) if needs_grad else None
        top = torch.empty(M, top_k, device=hidden.device, dtype=torch.long)
        w = weight  # never copied: on GPU the head is bf16 and large; the hidden chunk is cast instead
        fused = _chunk_fn(hidden) if needs_grad else None
        gemm = w.dtype if w.device.type == "cuda" else torch.promote_types(hidden.dtype, w.dtype)
        for s in range(0, M, chunk):
            e = min(M, s + chunk)
            lab = labels[s:e]
            if fused is not None:
                logits = hidden[s:e].to(w.dtype) @ w.T
                if top_k:  # DFlash2's candidates, from the logits this chunk forms anyway
                    top[s:e] = logits.topk(top_k, dim=-1).indices
                ce[s:e], correct[s:e], grad_logits = fused(logits, lab, row_weight[s:e])
                grad[s:e] = (grad_logits @ w).to(grad.dtype)
                continue
            logits = upcast_matmul(hidden[s:e].to(gemm), w).to(acc_dtype)
            # one max pass gives both the stabiliser and the argmax; exp in place; no separate logsumexp
            mx, am = logits.max(dim=-1)
            if top_k:  # DFlash2's candidates, from the logits this chunk forms anyway
                top[s:e] = logits.topk(top_k, dim=-1).indices
            target = logits.gather(1, lab[:, None]).squeeze(1)
            probs = logits.sub_(mx[:, None]).exp_()
            total = probs.sum(dim=-1)
            ce[s:e] = mx + total.log() - target
            correct[s:e] = am == lab
            if needs_grad:  # d(w * CE)/d(logits) = w * (softmax - onehot)
                rw = row_weight[s:e]
                probs.mul_((rw / total)[:, None])
                probs[torch.arange(e - s, device=probs.device), lab] -= rw
                grad[s:e] = upcast_matmul_t(probs.to(gemm), w).to(grad.dtype)
        if weigh is not None:
            row_weight = weigh(ce)
            if needs_grad:
                grad.mul_(row_weight.to(grad.dtype)[:, None])
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(ce, correct, top, row_weight)
        return (ce * row_weight).sum(), ce, correct, top, row_weight

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_correct, _grad_top, _grad_weight):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None, None


def default_chunk(vocab_size: int) -> int:
    """Rows per chunk so one chunk's fp32 logits stay near CHUNK_ELEMENTS (256 MB): big GEMMs, bounded memory."""
    return max(16, CHUNK_ELEMENTS // vocab_size)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                               row_weight: torch.Tensor | Callable[[torch.Tensor], torch.Tensor],
                               chunk: int | None = None, top_k: int = 0):
    """(sum_i row_weight_i * CE(hidden_i @ weight.T, labels_i), per-row CE, per-row argmax==label, per-row top-k
    ids [M, top_k], row_weight [M]), chunked. `row_weight` must already contain the normalisation; it may be a
    function of the per-row CE (fp32 [M], no grad) returning it, evaluated after the pass (D-PACE)."""
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        acc_dtype = torch.promote_types(hidden.dtype, torch.float32)
        rw = row_weight if callable(row_weight) else row_weight.to(acc_dtype)
        return _FusedLinearCE.apply(hidden, weight, labels, rw, chunk or default_chunk(weight.shape[0]), top_k)


@dataclass
class LossOutput:
    loss: torch.Tensor            # scalar, differentiable
    ce_sum: torch.Tensor          # [B-1] unweighted CE summed over valid slots at each position (no grad)
    correct: torch.Tensor         # [B-1] argmax hits at each position
    count: torch.Tensor           # [B-1] valid slots at each position
    rows: torch.Tensor | None = None      # [M] flat (block, slot) index of each valid slot, in `top_ids` order
    row_weight: torch.Tensor | None = None  # [M] each valid slot's normalised weight
    top_ids: torch.Tensor | None = None   # [M, top_k] the LM head's top-k ids per valid slot (top_k > 0)
    selector: Any = None                  # DFlash2: the dflash2.SelectorOutput folded into `loss`


def _normalised(w: torch.Tensor, normalization: str) -> torch.Tensor:
    """Valid slots' weights [M] divided by their sum ("weights") or their count ("mask")."""
    denom = w.sum() if normalization == "weights" else torch.tensor(float(w.numel()), device=w.device)
    return w / denom.clamp_min(1e-12)


def _row_weights(weighting: str, valid: torch.Tensor, sel: torch.Tensor, gamma: float, alpha: float,
                 normalization: str, dtype: torch.dtype):
    """The valid slots' normalised weights [M] ("decay": known before the pass), or for "dpace" the function of
    their CE [M] that gives them (scattered back into blocks for the per-block products)."""
    N, S = valid.shape
    if weighting == "decay":
        w = slot_weights(S + 1, gamma, valid.device, dtype)[None, :].expand(N, S)
        return _normalised(w.reshape(-1)[sel], normalization)
    if weighting != "dpace":
        raise ValueError(f"drafter.loss_weights={weighting!r}: use 'decay' or 'dpace'")

    def weigh(ce: torch.Tensor) -> torch.Tensor:
        blocks = torch.zeros(N * S, device=ce.device, dtype=ce.dtype).index_put((sel,), ce).view(N, S)
        return _normalised(dpace_weights(blocks, valid, alpha).reshape(-1)[sel], normalization)

    return weigh


def dflash_loss(hidden: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor,
                gamma: float, normalization: str = "weights", chunk: int | None = None, top_k: int = 0,
                weighting: str = "decay", dpace_alpha: float = 0.5) -> LossOutput:
    """hidden [N, B, H] from the drafter; labels/valid [N, B-1] from `block_labels`. `weighting`: "decay"
    (exp(-(k-1)/gamma)) or "dpace" (with `dpace_alpha`). top_k > 0 also returns each valid slot's top-k token ids
    (DFlash2's selector candidates)."""
    if normalization not in ("weights", "mask"):
        raise ValueError(f"drafter.loss_normalization={normalization!r}: use 'weights' or 'mask'")
    N, B, H = hidden.shape
    valid = valid.bool()
    sel = valid.reshape(-1).nonzero().flatten()
    rows_w = _row_weights(weighting, valid, sel, gamma, dpace_alpha, normalization,
                          torch.promote_types(hidden.dtype, torch.float32))
    slot_hidden = hidden[:, 1:, :].reshape(-1, H)[sel]
    loss, ce, correct, top, rows_w = fused_linear_cross_entropy(slot_hidden, lm_head, labels.reshape(-1)[sel],
                                                                rows_w, chunk, top_k)
    pos = (sel % (B - 1))
    zeros = torch.zeros(B - 1, device=hidden.device, dtype=ce.dtype)
    return LossOutput(loss=loss, ce_sum=zeros.index_add(0, pos, ce.detach()),
                      correct=zeros.index_add(0, pos, correct.to(ce.dtype)),
                      count=zeros.index_add(0, pos, torch.ones_like(ce)), rows=sel, row_weight=rows_w,
                      top_ids=top if top_k else None)
