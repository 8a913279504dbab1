"""The plan prices data.responses: no generation GPU-hours with the dataset's own replies, both modes side by side in
`--compare`, and the trade (replies not from the target) said wherever the plan is shown."""

import json

from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.components.plan.compare import RESPONSES_TRADE, compare_markdown
from flashdraft.components.plan.planner import comparison_of, make_plan, plan_markdown
from flashdraft.config import load_config


def _plans():
    target = load_config(preset="qwen3.6-27b")
    return make_plan(target), make_plan(target.with_overrides({"data.responses": "dataset"}))


def test_dataset_responses_plan_no_generation_gpu_hours_and_the_rest_unchanged():
    target, dataset = _plans()
    assert target.gpu_hours["generate"].gpu_hours > 0 and target.tokens_to_generate > 0
    assert dataset.gpu_hours["generate"].gpu_hours == 0 and dataset.tokens_to_generate == 0
    for stage in ("extract", "train"):
        assert dataset.gpu_hours[stage] == target.gpu_hours[stage], stage
    assert dataset.total_bytes_at_rest == target.total_bytes_at_rest
    assert RESPONSES_TRADE in plan_markdown(dataset) and RESPONSES_TRADE not in plan_markdown(target)


def test_compare_shows_both_modes_for_the_configured_topology_whichever_is_configured():
    target, dataset = _plans()
    for plan, configured in ((target, "target"), (dataset, "dataset")):
        cmp = comparison_of(plan)
        options = {o.responses: o for o in cmp.responses}
        assert set(options) == {"target", "dataset"} and options[configured].configured
        row = cmp.row(cmp.configured)
        assert options[configured].total_cost_usd == row.total_cost_usd  # the configured row itself
        assert options["dataset"].tokens_to_generate == 0 < options["target"].tokens_to_generate
        assert options["dataset"].inference_gpu_hours < options["target"].inference_gpu_hours
        assert options["dataset"].total_cost_usd < options["target"].total_cost_usd
        assert options["dataset"].days < options["target"].days
        text = compare_markdown(cmp)
        assert "| responses | tokens to generate |" in text and RESPONSES_TRADE in text
    # the same two options from either side
    a = {o.responses: o.total_cost_usd for o in comparison_of(target).responses}
    b = {o.responses: o.total_cost_usd for o in comparison_of(dataset).responses}
    assert a == b


def test_plan_cli_with_dataset_responses():
    runner = CliRunner()
    out = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b", "--set", "data.responses=dataset", "--json"])
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)
    assert plan["gpu_hours"]["generate"]["gpu_hours"] == 0 and plan["responses"] == "dataset"
    compared = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b", "--compare"])
    assert compared.exit_code == 0, compared.output
    assert "Training replies (data.responses)" in compared.output
