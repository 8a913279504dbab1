"""The plan's price of evaluate (components/plan/evaluate_plan.py): what each part costs as the knobs move, the
refusal of suites that cannot finish inside evaluate's timeout (one line, with levers that really fit), the
preset's suites fitting, and evaluate's row in `flashdraft plan` and --json."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.components.evaluate.stage import Evaluate
from flashdraft.components.plan.planner import make_plan, plan_markdown
from flashdraft.config import load_config
from flashdraft.run import registry

PRESET = "qwen3.6-27b"
# One suite, fixed draft length, no baseline: the parts left are the target alone and the drafter.
ONE_SUITE = {"eval.suites": ["heldout"], "eval.num_draft_tokens": 15, "eval.baseline_prompts": 0,
             "eval.num_prompts": 64, "eval.max_new_tokens": 2048, "eval.target_batch": 16, "eval.timed_prompts": 2}


def _evaluate(**overrides):
    return make_plan(load_config(preset=PRESET, overrides=overrides)).evaluate


def test_the_presets_suites_fit_inside_evaluates_timeout():
    plan = make_plan(load_config(preset=PRESET))
    e = plan.evaluate
    assert e.suites == 9 and e.fits and e.wall_hours <= e.timeout_hours == Evaluate.timeout_s / 3600
    assert e.gpu.startswith("NVIDIA RTX PRO 6000") and e.hybrid_reforward
    assert set(e.hours) == {"target alone, one at a time (timed)", "target alone, batched (reference)",
                            "speculative (drafter)", "draft length (auto: full-block pass, first suite)",
                            "baseline drafter (first suite)"}
    assert e.wall_hours == pytest.approx(sum(e.hours.values()), abs=0.02)
    assert plan.gate is None


def test_each_part_moves_with_its_knob():
    base = _evaluate(**ONE_SUITE)
    assert set(base.hours) == {"target alone, one at a time (timed)", "target alone, batched (reference)",
                               "speculative (drafter)"}
    spec = base.hours["speculative (drafter)"]
    # twice the prompts: twice the drafter's work; twice the tau: half the cycles
    assert _evaluate(**ONE_SUITE | {"eval.num_prompts": 128}).hours["speculative (drafter)"] == pytest.approx(
        2 * spec, rel=0.01)
    assert _evaluate(**ONE_SUITE, **{"plan.eval_tau": 6.0}).hours["speculative (drafter)"] == pytest.approx(
        spec / 2, rel=0.01)
    # no recurrent state: a cycle is one target forward, not two (plus the same drafter forward)
    attention = _evaluate(**ONE_SUITE, **{"plan.target_state_bytes_per_sequence": 0})
    assert not attention.hybrid_reforward and 0.5 * spec < attention.hours["speculative (drafter)"] < 0.6 * spec
    # the reference one prompt at a time costs ~batch times what batches of 16 cost
    alone = _evaluate(**ONE_SUITE | {"eval.target_batch": 1})
    assert alone.hours["target alone, batched (reference)"] == 0
    batched = base.hours["target alone, batched (reference)"] + base.hours["target alone, one at a time (timed)"]
    assert alone.hours["target alone, one at a time (timed)"] > 6 * batched
    # a faster GPU (more bandwidth) prices every part lower
    faster = _evaluate(**ONE_SUITE, **{"plan.gpu_overrides": {"rtx-pro-6000": {"bandwidth_gbs": 3194}}})
    assert faster.wall_hours == pytest.approx(base.wall_hours / 2, rel=0.02)


def test_the_draft_length_pass_and_the_baseline_are_priced_when_they_run():
    e = _evaluate(**ONE_SUITE | {"eval.num_draft_tokens": "auto", "eval.baseline_prompts": 4})
    spec = e.hours["speculative (drafter)"]
    assert e.hours["draft length (auto: full-block pass, first suite)"] == pytest.approx(spec, rel=0.01)
    # the untrained baseline: tau 1, 4 of 64 prompts
    assert e.hours["baseline drafter (first suite)"] == pytest.approx(spec * 4 / 64 * 3.0, rel=0.05)


def test_suites_over_the_timeout_are_refused_in_one_line_with_levers_that_fit():
    cfg = load_config(preset=PRESET, overrides={"eval.num_prompts": 80, "eval.max_new_tokens": 2048})
    plan = make_plan(cfg)
    assert not plan.evaluate.fits and plan.evaluate.wall_hours > 6
    gate = plan.gate
    assert gate.startswith("evaluate: 9 suites, 720 prompts need ") and "\n" not in gate
    assert "over evaluate's 6 h timeout" in gate and "plan.eval_tau" in gate
    prompts = int(gate.split("eval.num_prompts (now 80; <= ")[1].split(" ")[0])
    tokens = int(gate.split("eval.max_new_tokens (now 2048; <= ")[1].split(" ")[0])
    assert make_plan(cfg.with_overrides({"eval.num_prompts": prompts})).evaluate.fits
    assert not make_plan(cfg.with_overrides({"eval.num_prompts": prompts + 1})).evaluate.fits
    assert make_plan(cfg.with_overrides({"eval.max_new_tokens": tokens})).evaluate.fits
    assert not make_plan(cfg.with_overrides({"eval.max_new_tokens": tokens + 1})).evaluate.fits


def test_the_timeout_is_the_evaluate_stages_own():
    cfg = load_config(preset=PRESET, overrides={"eval.num_prompts": 80, "eval.max_new_tokens": 2048})

    class LongEvaluate(Evaluate):
        timeout_s = 48 * 3600

    with registry.active(registry.builtin().with_stage(LongEvaluate(), after="train")):
        plan = make_plan(cfg)
    assert plan.evaluate.timeout_hours == 48 and plan.evaluate.fits and plan.gate is None


def test_a_cpu_pool_has_no_price_and_no_refusal():
    plan = make_plan(load_config(preset="tiny", overrides={"eval.num_prompts": 10_000}))
    assert plan.evaluate is None and plan.gate is None
    assert "evaluate" not in plan.dump()


def test_plan_shows_evaluates_row_and_json():
    result = CliRunner().invoke(app, ["plan", "--preset", PRESET, "--json"])
    assert result.exit_code == 0, result.output
    e = json.loads(result.output)["evaluate"]
    assert e["fits"] is True and e["decoded_tokens"] > 0 and e["gpu_hours"] > 0
    text = plan_markdown(make_plan(load_config(preset=PRESET)))
    row = next(line for line in text.splitlines() if line.startswith("| evaluate |"))
    assert f"{e['decoded_tokens']:,}" in row and f"{e['gpu_hours']:,.1f}" in row
    assert f"of its {e['timeout_hours']:g} h timeout (fits" in text
    refused = CliRunner().invoke(app, ["plan", "--preset", PRESET, "--gate", "--set", "eval.num_prompts=80",
                                       "--set", "eval.max_new_tokens=2048"])
    assert refused.exit_code == 3 and "over evaluate's 6 h timeout" in refused.output
