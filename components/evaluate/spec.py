"""Speculative decoding with a DFlash drafter and an HF target, plus the plain target decode it is judged against.

One cycle (DFlash, dflash.md section 3): the drafter proposes B-1 tokens in one forward over
[last verified token, MASK x (B-1)] using the target's context features; the target verifies the block
[last, d_1..d_{B-1}] in one forward with its KV cache; the longest prefix of drafts that equals the target's own
choice at each position is accepted, plus the target's token after it (the bonus). The KV cache is then cropped
back to the accepted length (recurrent layers of hybrid targets: rolled back, see target_cache.py), and the
captured features of the accepted positions extend the drafter's context. A DFlash2 drafter's session proposes by
its candidate selector's greedy walk (flashdraft/drafter/dflash2.py: each slot picks among the LM head's top-k
given the previous pick, as vLLM's DFlash2 speculator does at temperature 0); verification and acceptance are the
same, so the lossless check holds for both kinds.

Both decoders use the same target forwards (prefill, then cached steps), so their timings compare honestly and
greedy outputs must agree token for token: that is the lossless check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from flashdraft.target.capture import capture_layers

from .target_cache import VerifyCache


class DraftSession(Protocol):
    """One sequence's drafting state (flashdraft.drafter.session.DraftSession keeps the context's projected keys/
    values, so a cycle costs the newly verified positions plus one block, not the whole context). `extend` gets
    the newly verified positions' target features and their token ids: a DFlash drafter reads the features,
    prompt lookup (ngram.py) the ids."""

    def extend(self, features: torch.Tensor, tokens: torch.Tensor | None = None) -> None: ...

    def propose(self, last_token: int, num_drafts: int | None = None) -> torch.Tensor: ...  # B-1 (or k) drafts


class Proposer(Protocol):
    """What the evaluation needs from a drafter (flashdraft.drafter.dflash_drafter.DFlashDrafter provides it)."""

    def new_session(self) -> DraftSession: ...


def reads_layers(drafter: Proposer, layer_ids: Sequence[int]) -> Sequence[int]:
    """The target layers whose outputs `drafter` reads: its own `reads_layers` (the MTP head: the last layer's), else
    the run's DFlash feature layers."""
    return getattr(drafter, "reads_layers", None) or layer_ids


@dataclass
class Generation:
    """Tokens generated after the prompt, and for speculative runs the accepted draft count of every cycle."""

    tokens: list[int]
    seconds: float
    accepted: list[int] = field(default_factory=list)  # a per cycle (bonus excluded; tau counts a + 1)
    drafted: list[int] = field(default_factory=list)   # drafts proposed per cycle (prompt lookup: 0 on no match)
    block_size: int = 0                                 # drafted tokens per cycle + 1 (0: plain decode)
    margins: list[float] = field(default_factory=list)  # plain decode: top-1 minus top-2 logit per token
    batched: bool = False  # decoded beside other prompts: `seconds` is its share of the batch, not its own speed


AcceptRule = Callable[[torch.Tensor, torch.Tensor], int]


def greedy_accept(draft: torch.Tensor, target_choice: torch.Tensor) -> int:
    """Length of the longest prefix with draft[k] == target_choice[k] (target_choice[k] is the target's token
    after block position k, so it judges draft[k], which sits at block position k + 1)."""
    match = (draft == target_choice[: draft.numel()]).to(torch.int64)
    return int(match.cumprod(0).sum())


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature == 0:
        return int(logits.argmax(-1))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def rejection_accept(draft: torch.Tensor, logits: torch.Tensor, temperature: float,
                     generator: torch.Generator | None) -> tuple[int, int]:
    """Standard speculative sampling for a greedy (one-hot) drafter: accept d_k with probability p_k(d_k); on the
    first rejection sample from p_k with d_k removed; after all accepted, sample the bonus from p_B. The output
    is distributed exactly as sampling the target alone. Returns (accepted, next token)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    for k, tok in enumerate(draft.tolist()):
        p = probs[k]
        if torch.rand((), generator=generator) < p[tok]:
            continue
        residual = p.clone()
        residual[tok] = 0.0
        return k, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return draft.numel(), int(torch.multinomial(probs[draft.numel()], 1, generator=generator))


def _margin(logits: torch.Tensor) -> float:
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def _finish(tokens: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    tokens = tokens[:max_new_tokens]
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1]
    return tokens


def new_target_cache(model):
    """An empty dynamic cache for the target (both decoders and the cost measurement start from one)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


@torch.inference_mode()
def target_generate(model, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: set[int],
                    temperature: float = 0.0, generator: torch.Generator | None = None) -> Generation:
    """Plain autoregressive decode of the target alone: prefill, then one cached forward per token."""
    device = next(model.parameters()).device
    start = time.perf_counter()
    cache = new_target_cache(model)
    ids = torch.tensor([list(prompt_ids)], device=device)
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    tokens = [_pick(out.logits[0, -1], temperature, generator)]
    margins = [_margin(out.logits[0, -1])]
    while len(tokens) < max_new_tokens and tokens[-1] not in eos_ids:
        out = model(input_ids=torch.tensor([[tokens[-1]]], device=device), cache=cache, use_cache=True,
                    logits_to_keep=1)
        tokens.append(_pick(out.logits[0, -1], temperature, generator))
        margins.append(_margin(out.logits[0, -1]))
    tokens = _finish(tokens, max_new_tokens, eos_ids)
    return Generation(tokens=tokens, seconds=time.perf_counter() - start, margins=margins[: len(tokens)])


class _MarginRecorder:
    """A logits processor that changes nothing and keeps each step's top-1 minus top-2 logit per row (the lossless
    check's tie margin), on the device until the batch ends."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        top = torch.topk(scores.float(), 2, dim=-1).values
        self.steps.append(top[:, 0] - top[:, 1])
        return scores


@torch.inference_mode()
def target_generate_batch(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_ids: set[int],
                          pad_id: int) -> list[Generation]:
    """Greedy decode of the target alone for several prompts at once (left-padded, masked; HF `generate` keeps
    each model's own cache, positions and padding handling): the same tokens `target_generate` gives one prompt at
    a time, up to numerical ties (the lossless check's tie margin covers them). A fresh generation config, so the
    checkpoint's sampling defaults cannot apply; each row's `seconds` is its share of the batch (`batched`)."""
    from transformers import GenerationConfig, LogitsProcessorList

    device = next(model.parameters()).device
    start = time.perf_counter()
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[row, width - len(p):] = 1
    margins = _MarginRecorder()
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, repetition_penalty=1.0,
                              no_repeat_ngram_size=0, eos_token_id=sorted(eos_ids) or None, pad_token_id=pad_id)
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config,
                         logits_processor=LogitsProcessorList([margins]))
    rows = [_finish(r, max_new_tokens, eos_ids) for r in out[:, width:].tolist()]
    gaps = torch.stack(margins.steps, dim=1).tolist() if margins.steps else [[] for _ in rows]
    seconds = time.perf_counter() - start
    total = sum(len(r) for r in rows) or 1
    return [Generation(tokens=r, seconds=seconds * len(r) / total, margins=g[: len(r)], batched=True)
            for r, g in zip(rows, gaps, strict=True)]


@torch.inference_mode()
def speculative_generate(model, drafter: Proposer, prompt_ids: Sequence[int], layer_ids: Sequence[int],
                         max_new_tokens: int, eos_ids: set[int], temperature: float = 0.0,
                         generator: torch.Generator | None = None, accept: AcceptRule = greedy_accept,
                         reuse_cache: bool = True, num_drafts: int | None = None) -> Generation:
    """Speculative decode: target prefill (its token is the first output), then draft/verify cycles.

    Verification runs the block against the target's cache, which then keeps only the accepted prefix
    (target_cache.VerifyCache: a crop, or for recurrent layers a state snapshot, restore and re-forward of the
    accepted tokens). `reuse_cache=False` instead re-runs the whole verified sequence plus the block each cycle:
    quadratic, equally exact, kept as the reference the tests compare with. `accept` is the greedy acceptance
    rule; it is a parameter so a test can plug in a wrong one and see the lossless check catch it.
    `num_drafts` k (None: the drafter's B-1) drafts a block of k + 1 and verifies k + 1 tokens, as vLLM does with
    num_speculative_tokens=k (draft_length.py picks k for the device).
    """
    device = next(model.parameters()).device
    layer_ids = reads_layers(drafter, layer_ids)
    start = time.perf_counter()
    cache = new_target_cache(model)
    accepted: list[int] = []
    drafted: list[int] = []
    block_size = 0
    verified = torch.tensor(list(prompt_ids), device=device)  # x_0..x_{S-1}: tokens with features
    with capture_layers(model, layer_ids) as cap:
        out = model(input_ids=verified[None], cache=cache, use_cache=True, logits_to_keep=1)
        session = drafter.new_session()
        session.extend(cap.features()[0], verified)       # [S, n*H] for positions 0..S-1
        target_cache = VerifyCache(model, cache) if reuse_cache else None
        tokens = [_pick(out.logits[0, -1], temperature, generator)]
        done = tokens[-1] in eos_ids
        while len(tokens) < max_new_tokens and not done:
            last = tokens[-1]
            draft = session.propose(last, num_drafts).to(device=device, dtype=torch.long).reshape(-1)
            block = torch.cat([torch.tensor([last], device=device), draft])
            block_size = max(block_size, block.numel())   # prompt lookup may propose fewer (or no) drafts
            if target_cache is not None:
                target_cache.checkpoint()
                out = model(input_ids=block[None], cache=cache, use_cache=True)
            else:
                out = model(input_ids=torch.cat([verified, block])[None], use_cache=False,
                            logits_to_keep=block.numel())
            logits = out.logits[0, -block.numel():]       # [B, V]: the target's distribution after each position
            features = cap.features()[0][-block.numel():]  # [B, n*H]
            if temperature == 0:
                choice = logits.argmax(-1)
                n_ok = accept(draft, choice)
                nxt = int(choice[n_ok])
            else:
                n_ok, nxt = rejection_accept(draft, logits, temperature, generator)
            # Keep [last, d_1..d_n] in the cache and the context; the new token has no features until verified.
            if target_cache is not None:
                target_cache.keep(block, n_ok + 1, capture=cap)
            verified = torch.cat([verified, block[: n_ok + 1]])
            session.extend(features[: n_ok + 1], block[: n_ok + 1])
            new = draft[:n_ok].tolist() + [nxt]
            tokens.extend(new)
            accepted.append(n_ok)
            drafted.append(draft.numel())
            done = any(t in eos_ids for t in new)
    return Generation(tokens=_finish(tokens, max_new_tokens, eos_ids), seconds=time.perf_counter() - start,
                      accepted=accepted, drafted=drafted, block_size=block_size)
