"""Batched target-alone decoding (evaluate's reference on a GPU) against the one-prompt-at-a-time decode, on the
tiny CPU targets: the same tokens, stops and tie margins; and evaluate_prompts with batching keeps the lossless
check and times the target on its one-at-a-time prompts only."""

from __future__ import annotations

import pytest

from flashdraft.components.evaluate.evaluate import evaluate_prompts, summarize, target_batch
from flashdraft.components.evaluate.prompts import EvalPrompt
from flashdraft.components.evaluate.spec import target_generate, target_generate_batch
from flashdraft.config import load_config
from flashdraft.drafter.persistence import build_drafter
from flashdraft.target.model import load_causal_lm, load_hf_config, load_tokenizer

MAX_NEW = 12
QUESTIONS = ["Name three colours.", "Write one sentence about the sea, the sky and the long road between them.",
             "2+2=", "Explain what a compiler does, briefly."]


def _setup(preset: str):
    cfg = load_config(preset=preset)
    tok, model = load_tokenizer(cfg.target), load_causal_lm(cfg.target)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True)["input_ids"] for q in QUESTIONS]
    assert len({len(p) for p in prompts}) > 1, "prompts of different lengths: the batch is left-padded"
    return cfg, tok, model, prompts


@pytest.fixture(scope="module")
def tiny():
    return _setup("tiny")


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen35"], ids=["attention", "hybrid-gated-deltanet"])
def test_batched_decode_gives_the_one_at_a_time_tokens(tiny, preset):
    """A plain attention target and a hybrid (Gated DeltaNet) one: every row of a left-padded batch decodes
    exactly the tokens the prompt decodes alone, with the same top-2 margins."""
    cfg, tok, model, prompts = tiny if preset == "tiny" else _setup(preset)
    alone = [target_generate(model, p, MAX_NEW, set()) for p in prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    batched = target_generate_batch(model, prompts, MAX_NEW, set(), pad)
    assert [g.tokens for g in batched] == [g.tokens for g in alone]
    assert all(len(g.tokens) == MAX_NEW and g.batched for g in batched)
    for a, b in zip(alone, batched, strict=True):
        assert b.margins == pytest.approx(a.margins, abs=1e-4)


def test_a_row_that_meets_eos_stops_there_and_the_others_carry_on(tiny):
    """EOS in one row: that row ends at it (inclusive), as `target_generate` ends; the batch continues for the
    rest (padded after the stop)."""
    _, tok, model, prompts = tiny
    free = target_generate(model, prompts[0], MAX_NEW, set())
    eos = {free.tokens[4]}
    alone = [target_generate(model, p, MAX_NEW, eos) for p in prompts]
    batched = target_generate_batch(model, prompts, MAX_NEW, eos, pad_id=tok.pad_token_id or 0)
    assert [g.tokens for g in batched] == [g.tokens for g in alone]
    assert len(batched[0].tokens) <= 5 and batched[0].tokens[-1] in eos


def test_evaluate_prompts_batches_the_reference_keeps_the_check_and_times_only_single_streams(tiny):
    """batch=3 with eval.timed_prompts=1: prompt 0 decoded alone (timed), prompts 1-3 in one batch; the drafter's
    outputs still match the reference (lossless), the target's tokens equal the unbatched run's, and its tokens/s
    (the speedup's denominator) comes from prompt 0 alone."""
    cfg, tok, model, ids = tiny
    cfg = cfg.with_overrides({"eval.timed_prompts": 1})
    prompts = [EvalPrompt(prompt_id=f"p{i}", input_ids=p, source="test") for i, p in enumerate(ids)]
    drafter = build_drafter(cfg, load_hf_config(cfg.target), seed=5, tokenizer=tok)
    plain = evaluate_prompts(cfg, model, tok, prompts, {"drafter": drafter}, cfg.layer_ids(), max_new_tokens=MAX_NEW)
    run = evaluate_prompts(cfg, model, tok, prompts, {"drafter": drafter}, cfg.layer_ids(), max_new_tokens=MAX_NEW,
                           batch=3)
    assert run.lossless.checked and run.lossless.passed and run.lossless.prompts == 4
    assert [p.new_tokens for p in run.prompts] == [p.new_tokens for p in plain.prompts]
    assert run.target.tokens == plain.target.tokens
    assert run.drafter.speedup is not None and run.target.tokens_per_s > 0


def test_summarize_times_single_streams_only():
    from flashdraft.components.evaluate.spec import Generation

    alone = Generation(tokens=[1] * 10, seconds=2.0)
    share = Generation(tokens=[1] * 30, seconds=0.5, batched=True)
    assert summarize([alone, share]).tokens_per_s == 5.0
    assert summarize([alone, share]).tokens == 40
    assert summarize([share]).tokens_per_s is None


def test_only_a_greedy_gpu_run_batches():
    cfg = load_config(preset="tiny", overrides={"eval.target_batch": 16})
    assert target_batch(cfg, "cuda") == 16
    assert target_batch(cfg, "cpu") == 1
    assert target_batch(cfg.with_overrides({"eval.temperature": 0.7}), "cuda") == 1
