"""The draft length evaluate decodes with: the expected-speedup curve from given costs and acceptance picks the k
it should, and the costs are measured on a real target and drafter."""

from __future__ import annotations

import pytest

from flashdraft.components.evaluate.draft_length import (
    CycleCosts,
    best_num_drafts,
    draft_length_curve,
    expected_tokens,
    measure_cycle_costs,
)
from flashdraft.config import load_config
from flashdraft.drafter.persistence import build_drafter
from flashdraft.target.model import load_causal_lm, load_hf_config, load_tokenizer

# Issue 46's AVX2 machine: the SmolLM2-135M target's one-token step and verify forwards over 2..8 tokens (ms),
# and the smollm2-local drafter's held-out acceptance per position.
ISSUE_46_STEP = 66.5
ISSUE_46_VERIFY = [99.0, 102.0, 106.0, 115.0, 122.0, 129.0, 136.0]
ISSUE_46_ACCEPTANCE = [0.42, 0.21, 0.12, 0.05, 0.02, 0.02, 0.01]


def test_expected_tokens_is_the_bonus_plus_the_first_k_acceptance_rates():
    assert expected_tokens(ISSUE_46_ACCEPTANCE, 1) == pytest.approx(1.42)
    assert expected_tokens(ISSUE_46_ACCEPTANCE, 3) == pytest.approx(1.75)
    assert expected_tokens(ISSUE_46_ACCEPTANCE, 7) == pytest.approx(1.85)


def test_auto_picks_the_k_of_the_highest_expected_throughput_on_a_cpu_like_cost_curve():
    """Verify cost growing with k and acceptance falling fast: a short draft wins (k=3 here, not the full 7)."""
    costs = CycleCosts(ISSUE_46_STEP, ISSUE_46_VERIFY, [5.0] * 7)
    curve = draft_length_curve(costs, ISSUE_46_ACCEPTANCE)
    by_k = {p.num_drafts: p.expected_speedup for p in curve}
    for k in range(1, 8):  # the formula, by hand
        assert by_k[k] == pytest.approx(expected_tokens(ISSUE_46_ACCEPTANCE, k) * 66.5 / (5.0 + ISSUE_46_VERIFY[k - 1]),
                                        abs=1e-3)
    assert by_k[7] < 1.0 < by_k[3]
    assert best_num_drafts(curve) == 3


def test_a_flat_verify_cost_lets_the_whole_block_win():
    """GPU-like: verifying 8 tokens costs what verifying 2 does, so every accepted position is free gain."""
    curve = draft_length_curve(CycleCosts(20.0, [21.0] * 7, [2.0] * 7), ISSUE_46_ACCEPTANCE)
    assert best_num_drafts(curve) == 7


def test_equal_expected_speedups_pick_the_shorter_draft_and_unknown_points_are_skipped():
    """Acceptance 0 past position 2 with flat costs: k = 2..7 expect the same rate, so k=2 (less drafting).
    A run at a fixed k=2 measured no acceptance beyond it: those points have costs but no expectation."""
    costs = CycleCosts(10.0, [12.0] * 7, [1.0] * 7)
    assert best_num_drafts(draft_length_curve(costs, [0.5, 0.4, 0, 0, 0, 0, 0])) == 2
    fixed = draft_length_curve(costs, [0.5, 0.4])
    assert [p.expected_speedup is None for p in fixed] == [False, False] + [True] * 5
    assert fixed[6].verify_ms == 12.0
    with pytest.raises(ValueError, match="acceptance per position is empty"):
        best_num_drafts(draft_length_curve(costs, []))


def test_cycle_costs_are_measured_for_every_k_on_the_real_target():
    """Every k = 1..B-1 gets a verify and a draft time from the same calls the decoders make."""
    cfg = load_config(preset="tiny")
    tok, model = load_tokenizer(cfg.target), load_causal_lm(cfg.target)
    drafter = build_drafter(cfg, load_hf_config(cfg.target), seed=3).eval()
    prompt = tok("The colours of the rainbow are")["input_ids"]
    costs = measure_cycle_costs(model, drafter, prompt, cfg.layer_ids(), cfg.drafter.block_size, reps=2)
    assert costs.max_drafts == cfg.drafter.block_size - 1
    assert costs.step_ms > 0 and all(v > 0 for v in costs.verify_ms) and all(d > 0 for d in costs.draft_ms)


def test_the_card_recommends_the_evaluated_k_and_a_modelled_k_per_gpu():
    """The device evaluate ran on gets its chosen k; every GPU type the planner knows gets the roofline's k,
    marked modelled. At a batch of one a GPU verify is bandwidth-bound, so with acceptance at every position the
    whole block is expected to win there."""
    from flashdraft.components.evaluate.summary import EvaluateSummary
    from flashdraft.components.export.card import recommendations
    from flashdraft.components.plan.gpus import GPUS

    cfg = load_config(preset="smollm2-local")
    g = build_drafter(cfg, load_hf_config(cfg.target), seed=3).config_dict()
    costs = CycleCosts(ISSUE_46_STEP, ISSUE_46_VERIFY, [5.0] * 7)
    curve = [p.__dict__ for p in draft_length_curve(costs, ISSUE_46_ACCEPTANCE)]
    ev = EvaluateSummary.model_validate({"stage": "evaluate", "draft_length": {
        "mode": "auto", "num_drafts": 3, "block_size": 8, "device_name": "AMD EPYC (AVX2, 2 threads)",
        "curve": curve, "full_block": {"tau": 1.85, "acceptance_per_position": ISSUE_46_ACCEPTANCE}}})
    recs = recommendations(cfg, g, ev)
    assert recs[0] == {"device": "AMD EPYC (AVX2, 2 threads)", "num_speculative_tokens": 3,
                       "basis": "measured by evaluate (eval.num_draft_tokens auto)"}
    assert [r["device"] for r in recs[1:]] == [gpu.name for gpu in GPUS.values()]
    assert all(r["num_speculative_tokens"] == 7 and r["basis"].startswith("modelled") for r in recs[1:])
    assert recommendations(cfg, g, None) == []
