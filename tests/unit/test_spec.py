"""Speculative decoding core on the tiny target: lossless under any drafter, tau as expected, and a broken
acceptance rule is caught by the lossless check."""

from __future__ import annotations

import pytest
import torch
from support.scripted_drafter import ScriptedDrafter

from flashdraft.components.evaluate.evaluate import lossless_mismatches, summarize
from flashdraft.components.evaluate.prompts import EvalPrompt
from flashdraft.components.evaluate.spec import (
    Generation,
    greedy_accept,
    rejection_accept,
    speculative_generate,
    target_generate,
)
from flashdraft.config import load_config
from flashdraft.drafter.persistence import build_drafter
from flashdraft.target.capture import capture_layers
from flashdraft.target.model import load_causal_lm, load_hf_config, load_tokenizer

MAX_NEW = 20


@pytest.fixture(scope="module")
def tiny():
    cfg = load_config(preset="tiny")
    tok = load_tokenizer(cfg.target)
    model = load_causal_lm(cfg.target)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                     add_generation_prompt=True, tokenize=True)["input_ids"]
    reference = target_generate(model, prompt, MAX_NEW, set())
    return cfg, model, prompt, reference


def test_greedy_accept_counts_the_matching_prefix():
    target = torch.tensor([5, 6, 7, 8])
    assert greedy_accept(torch.tensor([5, 6, 7]), target) == 3
    assert greedy_accept(torch.tensor([5, 9, 7]), target) == 1
    assert greedy_accept(torch.tensor([9, 6, 7]), target) == 0


@pytest.mark.parametrize("wrong_from, expected_accept, reuse_cache",
                         [(None, 7, True), (2, 2, True), (0, 0, True), (3, 3, False)])
def test_speculative_greedy_is_lossless_and_accepts_what_matches(tiny, wrong_from, expected_accept, reuse_cache):
    """KV cache cropped after partial acceptance, or (reuse_cache=False) the recompute path for recurrent
    targets: either way the output is the target's own."""
    cfg, model, prompt, reference = tiny
    block = cfg.drafter.block_size
    drafter = ScriptedDrafter(reference.tokens, len(prompt), block, wrong_from)
    got = speculative_generate(model, drafter, prompt, cfg.layer_ids(), MAX_NEW, set(), reuse_cache=reuse_cache)
    assert got.tokens == reference.tokens
    assert drafter.feature_width == cfg.features.num_features * cfg.target.hidden_size
    assert all(reference.tokens[s - len(prompt)] == last for s, last in drafter.calls)
    full_cycles = got.accepted[:-1]  # the last cycle may run past max_new_tokens
    assert full_cycles and all(a == expected_accept for a in full_cycles)
    stats = summarize([got])
    assert stats.tau == pytest.approx(sum(a + 1 for a in got.accepted) / len(got.accepted), abs=1e-4)
    assert len(stats.acceptance_per_position) == block - 1


@pytest.mark.parametrize("cached", [True, False])
def test_dflash_drafter_is_lossless_in_the_real_loop(tiny, cached):
    """The evaluation's drafter (its context keys/values cached, or recomputed every cycle) inside
    speculative_generate: the output is the target's own whatever it drafts."""
    cfg, model, prompt, reference = tiny
    drafter = build_drafter(cfg, load_hf_config(cfg.target), seed=3).eval()

    class Session:
        def new_session(self):
            return drafter.new_session(cached=cached)

    got = speculative_generate(model, Session(), prompt, cfg.layer_ids(), MAX_NEW, set())
    assert got.tokens == reference.tokens and got.block_size == cfg.drafter.block_size


@pytest.mark.parametrize("num_drafts", [1, 3])
def test_fewer_drafts_than_the_block_is_lossless_and_verifies_k_plus_one(tiny, num_drafts):
    """At k < B-1 drafts (eval.num_draft_tokens, or auto's pick) every cycle verifies k + 1 tokens: an all-correct
    drafter is accepted k per cycle, and the output is the target's own token for token."""
    cfg, model, prompt, reference = tiny
    drafter = ScriptedDrafter(reference.tokens, len(prompt), cfg.drafter.block_size)
    got = speculative_generate(model, drafter, prompt, cfg.layer_ids(), MAX_NEW, set(), num_drafts=num_drafts)
    assert got.tokens == reference.tokens and got.block_size == num_drafts + 1
    assert got.accepted[:-1] and all(a == num_drafts for a in got.accepted[:-1])
    assert len(summarize([got]).acceptance_per_position) == num_drafts


def test_a_real_drafter_at_k_drafts_a_shorter_block_losslessly(tiny):
    """The trained drafter's k drafts come from a block of k + 1 slots (as vLLM's DFlash proposer drafts with
    num_speculative_tokens=k), cached context or not, and decoding with them stays lossless."""
    cfg, model, prompt, reference = tiny
    drafter = build_drafter(cfg, load_hf_config(cfg.target), seed=3).eval()
    with capture_layers(model, cfg.layer_ids()) as cap, torch.inference_mode():
        model(input_ids=torch.tensor([prompt]), logits_to_keep=1)
        feats = cap.features()[0]
    session = drafter.new_session()
    session.extend(feats)
    short = session.propose(prompt[-1], 3)
    assert short.shape == (3,)
    assert torch.equal(short, drafter.propose_block(feats, prompt[-1], block_size=4))
    got = speculative_generate(model, drafter, prompt, cfg.layer_ids(), MAX_NEW, set(), num_drafts=3)
    assert got.tokens == reference.tokens and got.block_size == 4


def test_cached_drafter_drafts_exactly_what_the_recomputing_drafter_drafts(tiny):
    """Cycle by cycle (context extended by 1..B verified positions, as acceptance varies), the drafter reading
    its cached context keys/values gives the logits of the one that recomputes the whole context: equal drafts,
    logits equal to fp32 rounding (the GEMMs see other row counts, so not bit-equal)."""
    cfg, model, prompt, reference = tiny
    drafter = build_drafter(cfg, load_hf_config(cfg.target), seed=5).eval()
    ids = list(prompt) + reference.tokens
    with capture_layers(model, cfg.layer_ids()) as cap, torch.inference_mode():
        model(input_ids=torch.tensor([ids]))
        feats = cap.features()[0]
    cached, recompute = drafter.new_session(), drafter.new_session(cached=False)
    S = len(prompt)
    cached.extend(feats[:S])
    recompute.extend(feats[:S])
    for step in (1, 3, cfg.drafter.block_size, 2, 1, 5):  # accepted drafts + 1 per cycle
        a, b = cached.logits(ids[S]), recompute.logits(ids[S])
        assert a.shape[0] == cfg.drafter.block_size - 1
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert a.std() > 1e-3  # not a degenerate drafter whose logits are all equal
        cached.extend(feats[S:S + step])
        recompute.extend(feats[S:S + step])
        S += step
    assert cached.cache.length == S == recompute.features.shape[0]
    assert cached.cache.keys[0].shape[2] == S


def test_broken_acceptance_rule_fails_the_lossless_check(tiny):
    cfg, model, prompt, reference = tiny
    drafter = ScriptedDrafter(reference.tokens, len(prompt), cfg.drafter.block_size, wrong_from=1)

    def off_by_one(draft, choice):  # accepts one draft token too many
        return min(draft.numel(), greedy_accept(draft, choice) + 1)

    got = speculative_generate(model, drafter, prompt, cfg.layer_ids(), MAX_NEW, set(), accept=off_by_one)
    bad = lossless_mismatches([EvalPrompt("p-broken", list(prompt), "test")], [reference], [got], "drafter")
    assert [m.prompt_id for m in bad] == ["p-broken"]
    assert bad[0].first_mismatch == 2  # slot 1 (the corrupted one) is the first wrongly accepted token


def test_divergence_at_a_numerical_tie_is_reported_but_only_a_tie_below_the_margin(tiny):
    _, _, _, reference = tiny
    assert len(reference.margins) == len(reference.tokens) and min(reference.margins) >= 0
    prompt = [EvalPrompt("p", [0], "test")]
    ref = Generation(tokens=[1, 2, 3], seconds=1.0, margins=[5.0, 0.001, 4.0])
    at_tie, at_confident = Generation(tokens=[1, 9, 3], seconds=1.0), Generation(tokens=[7, 2, 3], seconds=1.0)
    strict = lossless_mismatches(prompt, [ref], [at_tie], "drafter")
    assert strict[0].first_mismatch == 1 and strict[0].margin == 0.001 and not strict[0].tie
    assert lossless_mismatches(prompt, [ref], [at_tie], "drafter", tie_margin=0.01)[0].tie
    assert not lossless_mismatches(prompt, [ref], [at_confident], "drafter", tie_margin=0.01)[0].tie


def test_rejection_sampling_preserves_the_target_distribution():
    """With a one-hot draft, the first emitted token must follow the target's softmax exactly."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    n = 4000
    counts = torch.zeros(4)
    for _ in range(n):
        accepted, nxt = rejection_accept(torch.tensor([1]), logits, 1.0, gen)
        counts[1 if accepted else nxt] += 1
    expected = torch.softmax(logits[0], -1)
    assert torch.allclose(counts / n, expected, atol=0.03)  # > 4 standard errors at n=4000
