"""Every target family through every stage, with no geometry hints: a tiny random Llama (llama3 rope scaling),
Qwen3, Qwen3-MoE, gpt-oss (attention sinks, sliding window 8 alternating with full attention, MoE) and the Qwen3.5
hybrid (Gated DeltaNet), each saved by transformers' own class as a user's checkpoint would be
(tests/target_families.py) and run as `target.source=hf`: plan (from the model's own config), prep, generate,
extract, train, evaluate (speculative decoding, lossless against the target alone, rolling back sliding-window and
recurrent caches) and export. The stages run in this process through the runner (no kfp.local): ~5-10 s a family.
The Llama 160 wide (not a multiple of q4's block of 64) runs with bf16-zstd: the plan shows q4 as n/a, and a run
that selects q4 is refused in one line.
The vLLM tier for a non-Qwen family is not run here (docs/testing.md says why)."""

from __future__ import annotations

import json

import pytest
from support.target_families import FAMILIES, SLIDING_WINDOW, build_family, hidden_size
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.components.export.export import read_export
from flashdraft.components.plan.planner import plan_markdown
from flashdraft.components.plan.summary import PlanSummary
from flashdraft.config import load_config
from flashdraft.config.derived import dflash_layer_ids
from flashdraft.features.manifest import committed_parts
from flashdraft.run.runner import run_task
from flashdraft.storage import layout
from flashdraft.storage.store import open_store

pytestmark = [pytest.mark.timeout(900)]

STAGES = [("plan", None), ("prep", None), ("generate", 0), ("extract", 0), ("train", None), ("evaluate", None),
          ("export", None)]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_runs_every_stage_without_hints_and_decodes_losslessly(family, tmp_path):
    model_dir, hidden = build_family(family, tmp_path / family), hidden_size(family)
    sets = {"target.source": "hf", "target.model": str(model_dir), "target.dtype": "float32",
            "target.num_layers": None, "target.hidden_size": None, "storage.root": f"file://{tmp_path}/store",
            "data.max_samples": 6, "data.eval_count": 1, "data.max_response_tokens": 8, "data.num_shards": 1,
            "eval.num_prompts": 1, "eval.max_new_tokens": 3 * SLIDING_WINDOW, "eval.baseline_prompts": 0,
            "training.epochs": 1, "training.num_threads": 1, "drafter.draft_vocab_size": 512}
    cfg = load_config(preset="tiny", overrides=sets)
    assert cfg.target.num_layers is None and cfg.target.hidden_size is None and cfg.target.vocab_size is None
    summaries = {stage: run_task(cfg, stage, shard) for stage, shard in STAGES}

    store = open_store(cfg.storage, cfg.run_id)
    plan = store.get_json_verified(layout.metrics_key("plan"))
    geo = plan["target_geometry"]
    assert geo["from_model_files"] and geo["hinted"] == [], geo["sources"]
    assert (plan["num_layers"], plan["hidden_size"], plan["bytes_per_token"]) == (8, hidden, 5 * hidden * 2)
    assert plan["codec"] == "bf16-zstd" and plan["codecs"]["bf16-zstd"]["unavailable"] is None
    q4 = plan["codecs"]["q4"]
    if hidden % 64:
        assert q4["unavailable"] == f"q4_block=64 needs hidden size divisible by it, got {hidden}" and \
            q4["total_bytes"] is None
        assert f"| q4 | no | n/a (q4_block=64 needs hidden size divisible by it, got {hidden}) | - | - |" in \
            plan_markdown(PlanSummary.model_validate(plan))  # the committed plan read back, typed
    else:
        assert q4["unavailable"] is None and q4["total_bytes"] > 0
    ids = dflash_layer_ids(8, 5)
    assert plan["layer_ids"] == ids
    moe = family in ("qwen3_moe", "gpt_oss")
    assert (geo["experts"] > 0) == moe and (geo["active_params"] < geo["params"]) == moe
    assert (geo["sliding_window"], geo["attention_sinks"]) == ((SLIDING_WINDOW, True) if family == "gpt_oss"
                                                               else (None, False))
    if family == "qwen3_5":
        assert geo["layer_types"] == {"linear_attention": 4, "full_attention": 4}

    assert {store.read_commit(k).meta["provenance"]["hidden_size"] for k in committed_parts(store)} == {hidden}
    evaluation = store.get_json_verified(layout.metrics_key("evaluate"))
    assert evaluation["lossless"]["checked"] and evaluation["lossless"]["passed"], evaluation["lossless"]
    assert summaries["evaluate"].drafter.tau >= 1.0
    zlab = json.loads(read_export(store, "zlab")["config.json"])
    assert zlab["dflash_config"]["target_layer_ids"] == ids and zlab["hidden_size"] == hidden


def test_a_run_selecting_a_codec_the_geometry_cannot_hold_is_refused_in_one_line(tmp_path):
    """The 160-wide Llama with features.codec=q4 (blocks of 64): `flashdraft plan` exits 1 with one line naming the
    codec, the reason and the codecs that hold the geometry."""
    model_dir = build_family("llama_h160", tmp_path / "llama_h160")
    sets = [f"target.model={model_dir}", "target.source=hf", "target.dtype=float32", "target.num_layers=null",
            "target.hidden_size=null", f"storage.root=file://{tmp_path}/store", "features.codec=q4"]
    res = CliRunner().invoke(app, ["plan", "--preset", "tiny", *[a for s in sets for a in ("--set", s)]],
                             terminal_width=400)
    assert res.exit_code == 1, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert ("features.codec=q4: q4_block=64 needs hidden size divisible by it, got 160 (codecs that hold it: bf16, "
            "bf16-zstd, fp8, fp8-zstd)") in res.output, res.output
