"""Does training pay? Prompt lookup as vLLM does it, decoded losslessly by the same speculative decoder; baselines
that cannot apply refused in one line; the verdict picks the fastest lossless decoder; a longer k only when it wins
by more than the timing spread."""

from __future__ import annotations

import pytest
import torch

from flashdraft.components.evaluate.baselines import select_baselines, verdicts
from flashdraft.components.evaluate.draft_length import CycleCosts, best_num_drafts, draft_length_curve, relative_spread
from flashdraft.components.evaluate.evaluate import summarize
from flashdraft.components.evaluate.ngram import NgramProposer, lookup
from flashdraft.components.evaluate.spec import speculative_generate, target_generate
from flashdraft.components.evaluate.summary import (
    BaselineResult,
    DecodeStats,
    DraftLength,
    EvaluateSummary,
    SuiteResult,
)
from flashdraft.config import ConfigError, load_config
from flashdraft.target.model import load_causal_lm, load_tokenizer


def test_lookup_takes_the_longest_suffix_then_its_earliest_match_and_what_followed():
    seq = [1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3]
    # suffix [2, 3] (n=2) occurs at 1 and 5: the earliest (vLLM's choice) is followed by 9, 1, 2
    assert lookup(seq, 1, 2, 3) == [9, 1, 2]
    # n=3 is tried first: [5, 2, 3] never occurred before, so it falls back to n=2
    assert lookup(seq, 2, 3, 2) == [9, 1]
    assert lookup(seq, 3, 3, 2) == []                      # min 3: no match at all -> no drafts
    assert lookup([4, 5, 4, 5, 4], 1, 2, 9) == [5, 4]      # overlapping match; capped at the sequence's end
    assert lookup([7], 1, 5, 3) == []


def test_prompt_lookup_defaults_follow_vllm():
    cfg = load_config(preset="tiny")
    assert cfg.eval.prompt_lookup() == (5, 5)  # vLLM: both unset -> 5 and 5
    assert cfg.with_overrides({"eval.prompt_lookup_max": 3}).eval.prompt_lookup() == (3, 3)
    assert cfg.with_overrides({"eval.prompt_lookup_min": 2, "eval.prompt_lookup_max": 4}).eval.prompt_lookup() == (2, 4)
    with pytest.raises(ConfigError, match="eval.prompt_lookup_min=4 exceeds eval.prompt_lookup_max=2"):
        cfg.with_overrides({"eval.prompt_lookup_min": 4, "eval.prompt_lookup_max": 2}).eval.prompt_lookup()
    assert NgramProposer(7, 2, 4).speculative_config(3) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_ngram_decodes_losslessly_and_accepts_a_repeated_passage():
    """The tiny target's greedy output on a prompt that repeats itself: prompt lookup drafts from the prompt, the
    decoder accepts what the target would have said, and the output is the target's own, token for token."""
    cfg = load_config(preset="tiny")
    tok, model = load_tokenizer(cfg.target), load_causal_lm(cfg.target)
    text = "one two three four five six seven eight nine ten " * 4
    prompt = tok(text)["input_ids"]
    reference = target_generate(model, prompt, 24, set())
    # the target's own continuation, put in the prompt: lookup finds it there
    prompt = prompt + reference.tokens + prompt
    reference = target_generate(model, prompt, 24, set())
    got = speculative_generate(model, NgramProposer(4, 1, 3), prompt, [0], 24, set(), num_drafts=4)
    assert got.tokens == reference.tokens
    stats = summarize([got])
    assert stats.tau > 1.5 and stats.block_size == 5


def test_mtp_on_a_target_without_mtp_weights_is_refused_in_one_line():
    cfg = load_config(preset="tiny")
    chosen, refused = select_baselines(cfg, has_mtp=False)
    assert chosen == ["ngram"] and any(r.startswith("mtp: ") and "no mtp.* weights" in r for r in refused)
    with pytest.raises(ConfigError) as err:
        select_baselines(cfg.with_overrides({"eval.baselines": ["ngram", "mtp"]}), has_mtp=False)
    assert "\n" not in str(err.value) and str(err.value).startswith("eval.baselines: mtp: ")
    with pytest.raises(ConfigError, match="eval.baselines: published: no drafter.init_from"):
        select_baselines(cfg.with_overrides({"eval.baselines": ["published"]}), has_mtp=False)
    assert select_baselines(cfg.with_overrides({"eval.baselines": []}), has_mtp=False) == ([], [])


def _summary(ngram_tps: float, ngram_lossless: bool) -> EvaluateSummary:
    suite = SuiteResult(name="heldout", tau=2.0, speedup=1.2, target_tokens_per_s=10.0, drafter_tokens_per_s=12.0,
                        lossless_passed=True)
    ngram = BaselineResult(name="ngram", num_drafts=3, tau_full_block=1.4,
                           speculative_config={"method": "ngram", "num_speculative_tokens": 3},
                           suites={"heldout": DecodeStats(tokens_per_s=ngram_tps, speedup=ngram_tps / 10, tau=1.3)},
                           lossless={"heldout": ngram_lossless})
    return EvaluateSummary(suites=[suite], baselines=[ngram],
                           draft_length=DraftLength(mode="auto", num_drafts=4, block_size=8, tau=2.0))


def test_the_verdict_is_the_fastest_lossless_decoder_and_by_how_much():
    v = verdicts(_summary(15.0, True), {"method": "dflash", "num_speculative_tokens": 4})[0]
    assert (v.winner, v.runner_up, v.margin, v.num_drafts) == ("ngram", "drafter", 1.25, 3)
    assert v.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    assert "serve ngram at k=3 (tau 1.30, full block 1.40)" in v.line()
    # a faster decoder whose output diverged is never the answer
    v = verdicts(_summary(15.0, False), {"method": "dflash", "num_speculative_tokens": 4})[0]
    assert (v.winner, v.runner_up, v.margin) == ("drafter", "target", 1.2)
    assert "ngram" not in v.candidates
    # nothing beats the target alone: serve no speculation
    slow = _summary(5.0, True)
    slow.suites[0].drafter_tokens_per_s = 8.0
    v = verdicts(slow, None)[0]
    assert v.winner == "target" and v.speculative_config is None


def test_a_longer_k_is_chosen_only_when_it_wins_by_more_than_the_timing_spread():
    costs = CycleCosts(10.0, [12.0, 12.5, 13.0], [0.0] * 3)
    acceptance = [0.6, 0.1, 0.1]  # k=3 expects ~2% more than k=1
    curve = draft_length_curve(costs, acceptance)
    assert best_num_drafts(curve) == 3                 # no noise: the best expectation wins
    assert best_num_drafts(curve, spread=0.05) == 1    # within 5% noise: the shorter k
    assert relative_spread([10.0, 10.0, 11.0, 9.0, 10.0]) == pytest.approx(0.0)
    assert relative_spread([10.0, 12.0, 8.0, 10.0, 11.0]) == pytest.approx(0.1)


def test_a_draft_of_no_tokens_is_a_plain_step():
    """No lookup match: the cycle verifies only the newest token, as vLLM's ngram does without a match."""
    proposer = NgramProposer(4, 3, 3)
    session = proposer.new_session()
    session.extend(torch.zeros(3, 1), torch.tensor([1, 2, 3]))
    assert session.propose(4).numel() == 0


def test_compare_sets_each_tau_beside_its_k_and_the_full_block_tau_and_says_when_ks_differ():
    from flashdraft.components.report.compare import Comparison, RunRow, render_text

    rows = [RunRow(run="a", heldout_tau=1.91, num_drafts=4, tau_full_block=2.01,
                   baselines={"ngram": "1.30 @k=2 (full 1.35; 1.10x)"}, serve="drafter (1.05x ngram)"),
            RunRow(run="b", heldout_tau=2.005, num_drafts=7, tau_full_block=2.005)]
    comparison = Comparison(rows, {})
    head, a, b = comparison.table()
    assert head[7:10] == ["k", "held-out tau at k", "full-block tau"] and "ngram tau at its k" in head
    assert a[7:10] == ["4", "1.91", "2.01"] and b[head.index("ngram tau at its k")] == "-"
    assert a[head.index("serve")] == "drafter (1.05x ngram)"
    assert "different k (4, 7" in comparison.k_note() and comparison.k_note() in render_text(comparison)
    assert Comparison(rows[:1], {}).k_note() == ""


def test_the_plan_prints_the_free_alternatives_and_the_evaluate_only_command_beside_the_training_cost():
    from flashdraft.components.plan.planner import make_plan, plan_markdown

    cfg = load_config(preset="qwen3.6-27b")
    text = plan_markdown(make_plan(cfg, origin="--preset qwen3.6-27b"))
    cost, free = text.index("cost: $"), text.index("cost nothing to try")
    assert cost < free and "the target's own MTP head" in text
    assert ("flashdraft run-local --preset qwen3.6-27b --set drafter.init=pretrained --set drafter.init_from="
            in text and "--set training.max_steps=0" in text)
