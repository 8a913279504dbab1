"""The sweep pipeline (issue 50): `flashdraft compile --grid/--variants` builds one pipeline that generates and
extracts once, then runs a ParallelFor over its `variants` parameter with each variant's train (on the trainer
pool), evaluate, export and report; a variant changing what the features depend on is refused before compiling."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from flashdraft.cli.main import app


def compiled(tmp_path, *args):
    out = tmp_path / "p.yaml"
    res = CliRunner().invoke(app, ["compile", "--output", str(out), "--preset", "qwen3.6-27b", *args])
    return res, (list(yaml.safe_load_all(out.read_text())) if res.exit_code == 0 else None)


def dags(spec):
    return {name: set(c["dag"]["tasks"]) for name, c in spec["components"].items() if "dag" in c}


def test_a_sweep_compiles_one_extraction_and_a_loop_of_variant_runs_on_the_trainer_pool(tmp_path):
    res, docs = compiled(tmp_path, "--grid", "training.lr=1e-4,3e-4", "--grid", "drafter.block_size=8,16")
    assert res.exit_code == 0 and "a sweep of 4 variants" in res.output, res.output
    spec, platform = docs
    loops = dags(spec)
    variant_loops = [name for name, tasks in loops.items()
                     if tasks == {"train", "evaluate", "export", "variant-report"}]
    assert len(variant_loops) == 1, loops
    assert sum("extract" in tasks for tasks in loops.values()) == 1, "one extraction loop"
    assert not any("train" in tasks for name, tasks in loops.items() if name not in variant_loops)
    params = spec["root"]["inputDefinitions"]["parameters"]
    variants = params["variants"]["defaultValue"]
    assert [v["name"] for v in variants] == ["lr1e-4-block_size8", "lr1e-4-block_size16", "lr3e-4-block_size8",
                                             "lr3e-4-block_size16"]
    base = yaml.safe_load(params["config_yaml"]["defaultValue"])
    assert base["plan"]["train_variants"] == 4, "the plan gate prices every variant"
    for v in variants:
        assert v["overrides"]["run_id"] == f"{base['run_id']}-{v['name']}"
        assert v["overrides"]["data.features_from"] == f"{base['storage']['root']}/{base['run_id']}"
        assert v["overrides"]["plan.train_variants"] == 1, "a variant run is one of the trainings the base planned"
    train = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train"]
    assert train["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"].endswith("trainer_node_selector")
    report = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-variant-report"]
    assert report["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"].endswith("cpu_node_selector")


def test_a_plain_pipeline_has_no_variants_parameter_and_a_variant_changing_the_features_is_refused(tmp_path):
    res, docs = compiled(tmp_path)
    assert res.exit_code == 0 and "variants" not in docs[0]["root"]["inputDefinitions"]["parameters"]
    spec = tmp_path / "sweep.yaml"
    spec.write_text("variants:\n  - {name: small, overrides: {training.lr: 1.0e-4}}\n"
                    "  - {name: q4, overrides: {features.codec: q4}}\n")
    res, _ = compiled(tmp_path, "--variants", str(spec))
    assert res.exit_code == 1 and "variant q4: sets features.codec" in res.output, res.output


def test_a_run_on_another_runs_features_compiles_without_prep_generate_or_extract(tmp_path):
    res, docs = compiled(tmp_path, "--set", "data.features_from=s3://flashdraft/runs/base")
    assert res.exit_code == 0, res.output
    tasks = set().union(*dags(docs[0]).values(), docs[0]["root"]["dag"]["tasks"])
    assert {"plan-gate", "train", "evaluate", "export"} <= tasks
    assert not tasks & {"prep", "generate", "extract"}, tasks
