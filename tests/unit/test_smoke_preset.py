"""The smoke preset (issue 56): qwen3.6-27b-smoke is the production run cut to what proves a cluster, and priced
as cheap and short by the planner a user runs before submitting it (docs/cluster.md, "Smoke run")."""

from __future__ import annotations

import json
from importlib import resources

import yaml
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.config import load_config
from flashdraft.pipelines.pipeline import compile_pipeline

PRODUCTION, SMOKE = "qwen3.6-27b", "qwen3.6-27b-smoke"
# The keys the smoke preset cuts (sizes, steps, suites, its own run_id); every other key is production's.
CUT = {"run_id", "data.max_samples", "data.max_response_tokens", "data.eval_count", "data.num_shards",
       "data.expected_samples", "data.expected_tokens_per_sample", "training.epochs", "training.max_steps",
       "training.checkpoint_every", "training.heldout_samples", "training.heldout_every", "eval.num_prompts",
       "eval.max_new_tokens", "eval.suites"}


def _flat(data: dict, prefix: str = "") -> dict:
    """Dotted keys -> values, sections flattened one level (a pool or a drafter setting is one key)."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and not prefix:
            out |= _flat(value, f"{key}.")
        else:
            out[prefix + key] = value
    return out


def _preset(name: str) -> dict:
    return yaml.safe_load(resources.files("flashdraft.config.presets").joinpath(f"{name}.yaml").read_text())


def test_smoke_preset_is_production_but_for_the_cut_sizes():
    """Target, drafter, features, generation, pools, storage, mode and data sources are the production preset's, so
    the smoke run pulls the same weights and images onto the same pools; its suites are production suites."""
    production, smoke = _flat(_preset(PRODUCTION)), _flat(_preset(SMOKE))
    kept = {k: v for k, v in production.items() if k not in CUT}
    assert {k: smoke.get(k) for k in kept} == kept
    assert set(smoke) - set(production) <= CUT, "the smoke preset adds only cut keys"
    suites = _preset(SMOKE)["eval"]["suites"]
    assert len(suites) == 2 and all(s in _preset(PRODUCTION)["eval"]["suites"] for s in suites)
    cfg = load_config(preset=SMOKE)
    assert cfg.data.max_samples <= 500 and cfg.data.num_shards == 2 and 10 <= cfg.training.max_steps < 100
    assert cfg.eval.max_new_tokens <= 256 and cfg.data.max_response_tokens <= 512


def test_smoke_plan_costs_under_50_usd_and_3_hours_on_the_planned_pools():
    res = CliRunner().invoke(app, ["plan", "--preset", SMOKE, "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    (row,) = [r for r in plan["comparison"]["rows"] if r["configured"]]
    assert {p["pool"]: p["gpu"] for p in row["pools"]} == {"inference": "rtx-pro-6000", "trainer": "b200"}
    assert row["total_cost_usd"] < 50 and row["days"] * 24 < 3 and row["fits"], row
    assert plan["samples"] < 500 and plan["fits_budget"]


def _shape(preset: str, tmp_path) -> dict:
    """Tasks, components, images and placed executors of the preset's compiled pipeline."""
    path = compile_pipeline(load_config(preset=preset), str(tmp_path / f"{preset}.yaml"), registry="r.example",
                            tag="t1")
    spec, platform = yaml.safe_load_all(open(path).read())
    return {"tasks": sorted(spec["root"]["dag"]["tasks"]), "components": sorted(spec["components"]),
            "images": sorted({e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}),
            "placement": sorted(platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"])}


def test_smoke_and_production_compile_to_the_same_dag_and_images(tmp_path):
    """The same tasks, components and images: the smoke run exercises the production DAG."""
    smoke = _shape(SMOKE, tmp_path)
    assert smoke["images"] == [f"r.example/flashdraft-{n}:t1" for n in ("base", "inference", "trainer")]
    assert smoke == _shape(PRODUCTION, tmp_path)
