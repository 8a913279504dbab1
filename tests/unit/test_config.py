"""The typed run config: presets, derived values, overrides, and errors that name the field."""

import pytest

from flashdraft.config import ConfigError, load_config
from flashdraft.config.derived import default_gamma, dflash_layer_ids
from flashdraft.config.overrides import parse_override
from flashdraft.run import registry


@pytest.mark.parametrize(("layers", "ids"), [
    (32, [1, 8, 15, 22, 29]), (36, [1, 9, 17, 25, 33]), (64, [1, 16, 31, 46, 61]), (30, [1, 8, 14, 20, 27]),
])
def test_dflash_layer_ids_match_reference_table(layers, ids):
    assert dflash_layer_ids(layers, 5) == ids


def test_layer_ids_use_half_even_rounding():
    # L=40, n=8 from dflash.md: 1 + i*36/7 -> 26.71.. and 21.57..; the reference answer needs Python round().
    assert dflash_layer_ids(40, 8) == [1, 6, 11, 16, 22, 27, 32, 37]
    assert dflash_layer_ids(20, 1) == [10]


def test_presets_load_and_derive():
    prod = load_config(preset="qwen3.6-27b")
    assert prod.layer_ids() == [1, 16, 31, 46, 61]
    assert prod.target.trust_remote_code is False
    assert prod.drafter.resolved_gamma == 7.0
    assert registry.current().pool_config(prod.pools, "train").accelerator_count == 8
    assert registry.current().pool_config(prod.pools, "generate").gpu_type == "rtx-pro-6000"
    local = load_config(preset="smollm2-local")
    assert local.layer_ids() == [1, 8, 14, 20, 27]
    assert local.drafter.resolved_gamma == default_gamma(8) == 4.0


def test_cli_style_overrides_parse_yaml_values():
    cfg = load_config(preset="tiny", overrides=["training.lr=3e-4", "features.layer_ids=[0,2,4,6,7]",
                                                 "target.trust_remote_code=true"])
    assert cfg.training.lr == 3e-4
    assert cfg.layer_ids() == [0, 2, 4, 6, 7]
    assert cfg.target.trust_remote_code is True
    assert parse_override("a.b=") == ("a.b", "")


def test_dict_overrides_from_pipeline_parameters():
    cfg = load_config(preset="tiny").with_overrides({"mode.kind": "streaming", "mode.reuse": 3})
    assert (cfg.mode.kind, cfg.mode.reuse) == ("streaming", 3)


def test_yaml_file_merges_over_preset(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("training:\n  epochs: 1\nstorage:\n  root: memory://x\n")
    cfg = load_config(f, preset="tiny")
    assert cfg.training.epochs == 1 and cfg.storage.root == "memory://x"
    assert cfg.target.source == "tiny"  # untouched preset values survive the merge


def test_yaml_file_replaces_mappings_whole(tmp_path):
    f = tmp_path / "pools.yaml"
    f.write_text("pools:\n  trainer:\n    node_selector: {pool: b200-spot}\n")
    cfg = load_config(f, preset="qwen3.6-27b")
    assert cfg.pools.trainer.node_selector == {"pool": "b200-spot"}  # the preset's GPU label is gone
    assert cfg.pools.trainer.accelerator_count == 8  # sibling fields of the section still merge


@pytest.mark.parametrize(("override", "field", "why"), [
    ("features.layer_ids=[1,2,3,4,8]", "features.layer_ids", "target has 8 layers"),
    ("features.layer_ids=[1,2,3]", "features.layer_ids", "num_features=5"),
    ("features.layer_ids=[5,4,3,2,1]", "features.layer_ids", "strictly increasing"),
    ("drafter.block_size=1", "drafter.block_size", "greater than or equal to 2"),
    ("features.codec=gzip", "features.codec", "unknown codec 'gzip'"),
    ("storage.root=gs://bucket/x", "storage.root", "unsupported storage scheme 'gs'"),
    ("target.dtype=int4", "target.dtype", "bfloat16"),
    ("data.max_prompt_tokens=0", "data.max_prompt_tokens", "greater than or equal to 8"),
    ("generation.backend=tgi", "generation.backend", "vllm"),
    ("training.lr=-1", "training.lr", "greater than 0"),
    ("mode.kind=online", "mode.kind", "offline"),
    ("pools.trainer.accelerator_count=-8", "pools.trainer.accelerator_count", "greater than or equal to 0"),
    ("eval.num_prompts=0", "eval.num_prompts", "greater than or equal to 1"),
    ("eval.num_draft_tokens=0", "eval.num_draft_tokens", "`auto` or an integer 1 .. drafter.block_size - 1"),
    ("eval.num_draft_tokens=many", "eval.num_draft_tokens", "got 'many'"),
    ("plan.prefill_efficiency=2", "plan.prefill_efficiency", "less than or equal to 1"),
    ("training.typo=1", "training.typo", "Extra inputs"),
    ("run_id=bad/id", "run_id", "pattern"),
])
def test_invalid_values_name_the_field(override, field, why):
    with pytest.raises(ConfigError) as exc:
        load_config(preset="tiny", overrides=[override])
    assert field in str(exc.value) and why in str(exc.value)


def test_num_draft_tokens_is_auto_or_fits_the_block():
    """`auto` by default; an integer is kept, and one the drafter's block cannot hold is refused naming both
    fields (evaluate checks it before loading any model)."""
    cfg = load_config(preset="tiny")
    assert cfg.eval.num_draft_tokens == "auto" and cfg.eval.draft_tokens(cfg.drafter.block_size) is None
    fixed = load_config(preset="tiny", overrides=["eval.num_draft_tokens=3"])
    assert fixed.eval.draft_tokens(fixed.drafter.block_size) == 3
    too_many = load_config(preset="tiny", overrides=[f"eval.num_draft_tokens={cfg.drafter.block_size}"])
    with pytest.raises(ConfigError, match=r"eval.num_draft_tokens=\d+ exceeds drafter.block_size - 1"):
        too_many.eval.draft_tokens(too_many.drafter.block_size)


def test_missing_inputs_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_config(preset="nope")
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="path.to.key=value"):
        load_config(preset="tiny", overrides=["no-equals-sign"])
    with pytest.raises(ConfigError, match="no configuration"):
        load_config()
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)


def test_every_field_has_a_description():
    from flashdraft.cli.config_reference import iter_fields, undescribed_fields

    assert len(list(iter_fields())) > 130  # the walk reaches nested sections and data.sources[] items
    assert undescribed_fields() == [], "describe these fields in flashdraft/config/ (Field(description=...))"


def test_committed_config_reference_is_current():
    from pathlib import Path

    from flashdraft.cli.config_reference import REFERENCE_DOC, render

    committed = (Path(__file__).resolve().parents[2] / REFERENCE_DOC).read_text()
    assert committed == render() + "\n", (
        f"{REFERENCE_DOC} is stale: regenerate it with `flashdraft config-reference --output {REFERENCE_DOC}`")


def test_config_reference_shows_effective_nested_defaults():
    from flashdraft.cli.config_reference import render

    pools = render("pools")
    assert "| `pools.cpu.accelerator_type` | `str \\| None` | `null` |" in pools  # the cpu pool's own default
    assert '| `pools.trainer.accelerator_type` | `str \\| None` | `"nvidia.com/gpu"` |' in pools
    assert "## training" not in pools
    with pytest.raises(KeyError, match="no config section 'nope'"):
        render("nope")


def test_export_settings_are_config_fields():
    cfg = load_config(preset="tiny", overrides=["export.dtype=float32", "export.formats=[zlab, speculators, zlab]"])
    assert (cfg.export.dtype, cfg.export.formats) == ("float32", ["zlab", "speculators"])
    assert load_config(preset="tiny").export.formats == ["zlab"]
    with pytest.raises(ConfigError, match="export.formats"):
        load_config(preset="tiny", overrides=["export.formats=[onnx]"])


def test_hub_entries_take_a_config_one_or_several_splits_and_a_revision():
    """Sources and suites name a dataset config, a split or a list of splits (not both), and a revision; a config
    dumped and loaded again (every --set does that) keeps them."""
    cfg = load_config(preset="qwen3.6-27b")
    nemotron = cfg.data.sources[0]
    assert (nemotron.splits, nemotron.split_names, nemotron.config) == (["chat", "code", "math", "stem"],
                                                                        ["chat", "code", "math", "stem"], None)
    gsm8k = next(s for s in cfg.eval.suites if s.label == "gsm8k")
    assert (gsm8k.config, gsm8k.split_names) == ("main", ["test"])
    again = cfg.with_overrides({"data.seed": 3})
    assert again.data.sources == cfg.data.sources and again.eval.suites == cfg.eval.suites
    pinned = load_config(preset="tiny", overrides={"data.sources": [{"uri": "hf:a/b", "revision": "0123abc"}]})
    assert (pinned.data.sources[0].revision, pinned.data.sources[0].split_names) == ("0123abc", ["train"])
    with pytest.raises(ConfigError, match=r"data.sources.0: set split or splits, not both \(split 'chat'"):
        load_config(preset="tiny", overrides={"data.sources": [{"uri": "hf:a/b", "split": "chat", "splits": ["x"]}]})
