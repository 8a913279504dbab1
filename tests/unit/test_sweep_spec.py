"""A sweep's variants (flashdraft/config/sweep.py) and their run configs (pipelines/sweep.py `plan_sweep`): names,
grids, the settings a variant may not change, and the table the sweep ends with."""

from __future__ import annotations

import pytest

from flashdraft.config import ConfigError, load_config
from flashdraft.config.sweep import SweepSpec, Variant
from flashdraft.pipelines.sweep import VariantRow, plan_sweep, sweep_table


@pytest.fixture()
def base():
    return load_config(preset="tiny", overrides={"storage.root": "file:///data/runs", "run_id": "base"})


def test_a_grid_expands_to_every_combination_named_after_its_values_after_the_listed_variants():
    spec = SweepSpec.model_validate({"variants": [{"name": "dflash2", "overrides": {"drafter.kind": "dflash2"}}],
                                     "grid": {"training.lr": [1e-3, "3e-3"], "drafter.block_size": [8, 16]}})
    names = [v.name for v in spec.expand()]
    assert names == ["dflash2", "lr0.001-block_size8", "lr0.001-block_size16", "lr3e-3-block_size8",
                     "lr3e-3-block_size16"]
    assert spec.expand()[2].overrides == {"training.lr": 1e-3, "drafter.block_size": 16}


@pytest.mark.parametrize(("data", "message"), [
    ({}, "at least one variant"),
    ({"variants": [{"name": "a"}, {"name": "a"}]}, "repeat"),
    ({"variants": [{"name": "a b"}]}, "variant name"),
    ({"variants": [{"name": "a", "overrides": {"run_id": "x"}}]}, "sets ['run_id']"),
    ({"variants": [{"name": "a", "overrides": {"storage.root": "s3://x/y"}}]}, "sets ['storage.root']"),
])
def test_a_bad_sweep_is_refused_naming_what_is_wrong(data, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SweepSpec.model_validate(data).expand()


def test_each_variant_is_its_own_run_reading_the_base_run_and_the_plan_prices_them_all(base):
    sweep = plan_sweep(base, SweepSpec(grid={"training.lr": [1e-3, 3e-4]}))
    assert sweep.base.plan.train_variants == 2
    (_, first), (_, second) = sweep.variants
    assert (first.run_id, second.run_id) == ("base-lr0.001", "base-lr0.0003")
    assert first.data.features_from == second.data.features_from == "file:///data/runs/base"
    assert (first.training.lr, second.training.lr) == (1e-3, 3e-4)


@pytest.mark.parametrize(("field", "value", "stage"), [("features.codec", "q4", "extract"),
                                                       ("data.max_samples", 12, "prep"),
                                                       ("generation.temperature", 0.5, "generate")])
def test_a_variant_changing_what_the_features_depend_on_is_refused_before_anything_runs(base, field, value, stage):
    spec = SweepSpec(variants=[Variant(name="ok", overrides={"training.lr": 1e-4}),
                               Variant(name="bad", overrides={field: value})])
    with pytest.raises(ConfigError) as info:
        plan_sweep(base, spec)
    assert str(info.value).startswith(f"variant bad: sets {field}") and f"({stage})" in str(info.value)


def test_the_table_puts_the_variants_side_by_side_with_every_suite():
    rows = [VariantRow(variant="a", run_id="b-a", changes="training.lr=0.001", state="done",
                       tau={"heldout": 2.5, "humaneval": 2.0}, speedup=1.3, lossless=True, final_loss=1.234,
                       train_hours=0.5, trainer_gpu_hours=4.0),
            VariantRow(variant="b", run_id="b-b", changes="", state="failed (train)", tau={}, speedup=None,
                       lossless=None, final_loss=None, train_hours=None, trainer_gpu_hours=None)]
    lines = sweep_table(rows).splitlines()
    assert lines[0] == ("| variant | changes | state | tau heldout | tau humaneval | speedup | lossless | final loss "
                        "| train h | trainer GPU-h |")
    assert lines[2] == "| a | training.lr=0.001 | done | 2.50 | 2.00 | 1.30 | yes | 1.234 | 0.500 | 4.00 |"
    assert lines[3] == "| b | - | failed (train) | - | - | - | - | - | - | - |"
