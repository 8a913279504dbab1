"""Targets, not a target (issue 33): the presets of other families plan with their own geometry, a plan follows the
target it is given (its own config where its files are here, hints otherwise, and says which), and a setting that
contradicts the target is refused in one line naming the field."""

from __future__ import annotations

import json

import pytest
from support.target_families import build_family
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.components.plan.planner import make_plan
from flashdraft.config import ConfigError, load_config
from flashdraft.config.derived import dflash_layer_ids
from flashdraft.target.model import geometry_of, resolve_target


def _public_configs():
    """The published config.json values of each preset's target (the ones its comment cites)."""
    import transformers as tf

    return {
        "llama3.1-8b": tf.LlamaConfig(
            hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_hidden_layers=32,
            num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        "qwen3-8b": tf.Qwen3Config(
            hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_hidden_layers=36,
            num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
        "qwen3-30b-a3b": tf.Qwen3MoeConfig(
            hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
            num_key_value_heads=4, head_dim=128, num_hidden_layers=48, num_experts=128, num_experts_per_tok=8,
            vocab_size=151936, tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[]),
        "gpt-oss-20b": tf.GptOssConfig(
            hidden_size=2880, intermediate_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
            num_hidden_layers=24, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088, sliding_window=128,
            layer_types=["sliding_attention", "full_attention"] * 12, max_position_embeddings=131072,
            tie_word_embeddings=False),
    }


@pytest.mark.parametrize("preset, bytes_per_token", [("llama3.1-8b", 40_960), ("qwen3-8b", 40_960),
                                                     ("qwen3-30b-a3b", 20_480), ("gpt-oss-20b", 28_800)])
def test_family_presets_plan_with_their_own_geometry(preset, bytes_per_token):
    """Each preset's hints are its target's published config: layers, width, vocabulary, parameters (total and
    active, counted by transformers' own class on the meta device), KV and fixed per-sequence cache bytes; the plan
    charges 5 x hidden x 2 bytes a token, the DFlash ids over its depth and a drafter as wide as the target."""
    geo = geometry_of(_public_configs()[preset], preset, count=True)
    cfg = load_config(preset=preset)
    t = cfg.target
    assert (t.num_layers, t.hidden_size, t.vocab_size) == (geo.num_layers, geo.hidden_size, geo.vocab_size)
    assert t.params == pytest.approx(geo.params, rel=1e-3)
    assert (t.active_params or t.params) == pytest.approx(geo.active_params, rel=1e-3)
    assert cfg.drafter.hidden_size == geo.hidden_size
    assert cfg.plan.target_kv_bytes_per_token == geo.kv_bytes_per_token()
    assert (cfg.plan.target_state_bytes_per_sequence or 0) == geo.state_bytes_per_sequence()
    res = CliRunner().invoke(app, ["plan", "--preset", preset, "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    assert plan["bytes_per_token"] == bytes_per_token == 5 * geo.hidden_size * 2
    assert plan["layer_ids"] == dflash_layer_ids(geo.num_layers, 5)
    assert plan["target_geometry"]["hinted"] and not plan["target_geometry"]["from_model_files"]
    inference = plan["memory"]["inference"]
    assert inference["parts"]["target weights (bf16)"] == int(2 * t.params)  # every expert resident
    assert inference["fits"] and plan["memory"]["trainer"]["fits"]
    moe = geo.active_params < geo.params
    assert moe == (preset in ("qwen3-30b-a3b", "gpt-oss-20b")) == ("MoE; every expert resident" in CliRunner().invoke(
        app, ["plan", "--preset", preset]).output.replace("\n", " "))
    if moe:  # extraction's FLOPs come from the active parameters: a dense model of the same size is slower
        dense = make_plan(cfg.with_overrides({"target.active_params": None}))
        assert plan["gpu_hours"]["extract"]["tokens_per_s_per_gpu"] > 3 * dense.gpu_hours[
            "extract"].tokens_per_s_per_gpu


def test_a_drafter_width_that_contradicts_the_target_is_refused_in_one_line(tmp_path):
    """The issue's own command: the 27B preset pointed at Llama-3.1-8B by hints. The preset's drafter width is
    refused naming the field; the 27B's facts (vocabulary, parameters) do not outlive its model."""
    args = ["plan", "--preset", "qwen3.6-27b", "--set", "target.model=meta-llama/Llama-3.1-8B",
            "--set", "target.num_layers=32", "--set", "target.hidden_size=4096"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code != 0
    assert "drafter.hidden_size 5120 != target hidden size 4096" in res.output and len(res.output.splitlines()) == 1
    cfg = load_config(preset="qwen3.6-27b", overrides=["target.model=meta-llama/Llama-3.1-8B",
                                                       "target.num_layers=32", "target.hidden_size=4096",
                                                       "drafter.hidden_size=null"])
    assert (cfg.target.vocab_size, cfg.target.params, cfg.plan.target_kv_bytes_per_token) == (None, None, None)
    plan = make_plan(cfg)
    assert plan.bytes_per_token == 40_960 and plan.target_geometry.sources["vocab_size"].startswith("assumed")
    assert plan.target_geometry.params < 10e9  # estimated from 32 x 4096, not the 27B's
    # the same model again keeps its facts
    assert load_config(preset="qwen3.6-27b", overrides=["target.model=Qwen/Qwen3.6-27B"]).target.vocab_size == 248320


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return build_family("qwen3_moe", tmp_path_factory.mktemp("moe") / "qwen3_moe")


def test_plan_reads_the_model_config_where_its_files_are_and_refuses_contradicting_hints(moe_dir, tmp_path):
    """A Qwen3-MoE folder with no hints at all: the plan's geometry is the model's (width 64, its vocabulary,
    counted total and active parameters, all from the model config); a hint or plan figure it contradicts is
    refused naming the field."""
    base = {"target.source": "hf", "target.model": str(moe_dir), "target.num_layers": None,
            "target.hidden_size": None, "storage.root": f"file://{tmp_path}"}
    cfg = load_config(preset="tiny", overrides=base)
    target = resolve_target(cfg, hints=True)
    geo = target.geometry
    assert target.from_files and not target.hinted
    assert (geo.num_layers, geo.hidden_size, geo.num_experts, geo.experts_per_token) == (8, 64, 4, 2)
    assert geo.active_params < geo.params and target.layer_ids == tuple(dflash_layer_ids(8, 5))
    plan = make_plan(cfg)
    assert (plan.hidden_size, plan.bytes_per_token) == (64, 5 * 64 * 2)
    assert plan.target_geometry.vocab_size == geo.vocab_size and plan.target_geometry.experts == 4
    assert plan.memory["inference"]["parts"]["target weights (bf16)"] == 2 * geo.params
    for field, value in [("target.hidden_size", 128), ("drafter.hidden_size", 128), ("plan.target_vocab", 1000),
                         ("target.params", 1e9)]:
        with pytest.raises(ConfigError, match=rf"^{field} "):
            make_plan(cfg.with_overrides({field: value}))


def test_storage_plan_counts_only_extracted_samples_of_at_most_the_length_limits():
    """The tiny preset planned 55.6 MiB of features for the 5.4 MiB it stores: 40 samples of 800 tokens, where
    prep holds 4 out for evaluation (never extracted) and no sample can pass 128 prompt + 24 response tokens
    (measured: 36 samples, 3,177 tokens). Now 36 x 88 tokens: 5.5 MiB."""
    cfg = load_config(preset="tiny")
    plan = make_plan(cfg)
    assert (plan.samples, plan.tokens_per_sample) == (40 - 4, 88)
    assert plan.total_bytes_at_rest / 2**20 == pytest.approx(5.4, rel=0.05)
    long = make_plan(cfg.with_overrides({"data.expected_tokens_per_sample": 800}))
    assert long.tokens_per_sample == 128 + 24
    assert make_plan(cfg.with_overrides({"data.expected_samples": 100})).samples == 100  # stated: as is


def test_a_depth_cut_random_target_may_plan_the_published_parameter_count():
    """qwen3.6-27b-rehearsal builds 5 random layers of the 27B (source=random) and plans the 27B's 2.7e10
    parameters on purpose; the same statement about a checkpoint (source=hf) that counts 4.6e9 is refused."""
    from flashdraft.target.model import TargetGeometry, check_target_settings

    cfg = load_config(preset="qwen3.6-27b-rehearsal")
    built = TargetGeometry(num_layers=5, hidden_size=5120, vocab_size=248320, layer_types=None, model_type="qwen3_5",
                           params=4_600_000_000)
    check_target_settings(cfg, built, "the built rehearsal target")
    with pytest.raises(ConfigError, match=r"^plan.target_params 2.7e\+10 != the 4.6e\+09 parameters"):
        check_target_settings(cfg.with_overrides({"target.source": "hf"}), built, "a checkpoint")
