"""The planner reproduces the known case and gates over-budget offline runs."""

import json

import pytest
from typer.testing import CliRunner

from flashdraft.cli import app
from flashdraft.components.plan.planner import PlanGateError, make_plan, run_plan
from flashdraft.config import load_config


def test_known_case_37_tb():
    plan = make_plan(load_config(preset="qwen3.6-27b"))
    assert plan["bytes_per_token"] == 51_200 == 5 * 5120 * 2
    assert plan["samples"] * plan["tokens_per_sample"] == 913_786 * 800
    bf16 = plan["codecs"]["bf16"]
    assert bf16["bytes_per_token"] == 51_200
    assert round(bf16["total_bytes"] / 1e12, 1) == 37.4 and round(bf16["total_bytes"] / 2**40, 1) == 34.0
    # Compression ranks as it must, and fp8 stores one byte per value plus a scale per token and layer.
    sizes = [plan["codecs"][c]["total_bytes"] for c in ("bf16", "bf16-zstd", "fp8", "fp8-zstd")]
    assert sizes == sorted(sizes, reverse=True)
    assert plan["codecs"]["fp8"]["bytes_per_token"] == 5 * 5120 + 5 * 4


def test_gpu_hours_and_ratio_follow_the_pools():
    base = make_plan(load_config(preset="qwen3.6-27b"))
    faster = make_plan(load_config(preset="qwen3.6-27b", overrides=["plan.gpu_overrides.b200.bf16_tflops=4500"]))
    assert faster["gpu_hours"]["train"]["gpu_hours"] == pytest.approx(base["gpu_hours"]["train"]["gpu_hours"] / 2,
                                                                      rel=0.01)
    measured = make_plan(load_config(preset="qwen3.6-27b", overrides=["plan.measured_tokens_per_s.extract=10000"]))
    assert measured["gpu_hours"]["extract"]["tokens_per_s_per_gpu"] == 10000
    assert measured["inference_per_trainer_gpu"] < base["inference_per_trainer_gpu"]
    assert base["gpu_hours"]["generate"]["gpu"].startswith("NVIDIA RTX PRO 6000")


def test_gate_names_alternatives(tmp_path):
    cfg = load_config(preset="qwen3.6-27b", overrides={"features.codec": "bf16", "storage.budget_bytes": 20e12,
                                                       "storage.root": f"file://{tmp_path}"})
    with pytest.raises(PlanGateError) as exc:
        run_plan(cfg)
    msg = str(exc.value)
    assert "37.4 TB" in msg and "fp8" in msg and "streaming mode" in msg and "fewer samples" in msg
    # The plan is stored even when the gate refuses, so the report can show why.
    assert (tmp_path / cfg.run_id / "metrics" / "plan.json").is_file()
    ok = cfg.with_overrides({"features.codec": "fp8-zstd"})
    assert run_plan(ok).fits_budget is True
    streaming = cfg.with_overrides({"mode.kind": "streaming"})
    assert run_plan(streaming).gate is None


def test_cli_table_and_json():
    runner = CliRunner()
    res = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b"])
    assert res.exit_code == 0, res.output
    assert "37.4 TB" in res.output and "34.0 TiB" in res.output
    res = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b", "--json"])
    assert json.loads(res.output)["bytes_per_token"] == 51200
    res = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b", "--gate", "--set", "features.codec=bf16"])
    assert res.exit_code == 3
    res = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b", "--set", "pools.trainer.gpu_type=tpu"])
    assert res.exit_code == 2 and "unknown GPU 'tpu'" in res.output
