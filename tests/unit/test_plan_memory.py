"""The planner's resource model (components/plan/memory.py, resources.py): per-pool peaks with fits in the plan and
its JSON, the direction every lever moves the peak, the memory gate naming levers that do fit, calibration from
the checked-in H200 file, and the memory benchmark's child on a tiny shape. Accuracy against a measured peak is
`benchmarks/bench_memory.py`'s job, not a test's."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flashdraft.cli import app
from flashdraft.components.plan.memory import LOSS_CHUNK_ELEMENTS, trainer_memory
from flashdraft.components.plan.planner import PlanGateError, make_plan, run_plan
from flashdraft.components.plan.resources import train_shape
from flashdraft.config import load_config
from flashdraft.drafter.loss import CHUNK_ELEMENTS

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "benchmarks" / "calibration" / "h200-2026-12-04.json"


def _peak(overrides: list[str], device: str = "cuda") -> int:
    shape, _ = train_shape(load_config(preset="qwen3.6-27b", overrides=overrides))
    return trainer_memory(shape, device).peak_bytes


def test_plan_json_has_memory_per_pool_and_production_fits_b200():
    res = CliRunner().invoke(app, ["plan", "--preset", "qwen3.6-27b", "--json"])
    assert res.exit_code == 0, res.output
    mem = json.loads(res.output)["memory"]
    assert set(mem) == {"trainer", "inference"}
    train = mem["trainer"]
    assert train["gpu"] == "NVIDIA B200" and train["fits"] is True
    assert 0 < train["peak_bytes_per_gpu"] <= train["usable_bytes_per_gpu"]
    assert train["anchors_per_row"] == 10 * 512  # 8,192 tokens a rank of 800-token samples, 512 anchors each
    assert sum(train["parts"].values()) == train["peak_bytes_per_gpu"]
    assert mem["inference"]["gpu"].startswith("NVIDIA RTX PRO 6000") and mem["inference"]["fits"] is True
    # The same GPU's memory on an H200 does not hold the config's 5,120 anchors a row (the 2026-12-04 finding).
    h200 = make_plan(load_config(preset="qwen3.6-27b", overrides=["pools.trainer.gpu_type=h200"]))
    assert h200["memory"]["trainer"]["fits"] is False


def test_each_lever_moves_the_peak_the_right_way():
    base = _peak([])
    assert _peak(["training.tokens_per_step=16384"]) > base > _peak(["training.tokens_per_step=4096"])
    assert _peak(["drafter.max_anchors=1024"]) > base > _peak(["drafter.max_anchors=128"])
    # a draft vocabulary is a FLOPs lever, not a memory one: its head rows are gathered beside the full head
    assert _peak(["drafter.draft_vocab_size=32768"]) - base == 32768 * 5120 * 2
    assert _peak(["training.strategy=ddp"]) > base  # unsharded state plus DDP's buckets
    assert _peak(["drafter.num_layers=6"]) > base
    mlp, layer = _peak(["training.activation_checkpointing=mlp"]), _peak(["training.activation_checkpointing=layer"])
    assert base > mlp > layer
    # CPU terms: fp32 activations and the dense SDPA mask make the same step larger than on CUDA
    shape, _ = train_shape(load_config(preset="qwen3.6-27b"))
    cpu, cuda = trainer_memory(shape, "cpu"), trainer_memory(shape, "cuda")
    assert cpu.peak_bytes > cuda.peak_bytes and cpu.phase == "forward: last layer's dense mask"
    assert "autocast bf16 weight copies" in cuda.parts and not any("mask" in k for k in cuda.parts)
    assert LOSS_CHUNK_ELEMENTS == CHUNK_ELEMENTS


def test_gate_refuses_a_trainer_that_would_not_fit_and_names_levers_that_do(tmp_path):
    cfg = load_config(preset="qwen3.6-27b", overrides={"training.tokens_per_step": 65536,
                                                       "storage.root": f"file://{tmp_path}"})
    with pytest.raises(PlanGateError) as exc:
        run_plan(cfg)
    msg = str(exc.value)
    assert "pool trainer (train)" in msg and "NVIDIA B200" in msg
    for lever in ("training.tokens_per_step", "drafter.max_anchors", "drafter.draft_vocab_size", "loss chunk",
                  "training.activation_checkpointing=layer"):
        assert lever in msg
    # the value the gate proposes does fit
    tokens = int(msg.split("training.tokens_per_step (now 65,536; <= ")[1].split(" fits")[0].replace(",", ""))
    assert run_plan(cfg.with_overrides({"training.tokens_per_step": tokens})).gate is None
    assert run_plan(cfg.with_overrides({"training.tokens_per_step": 8192})).memory["trainer"]["fits"] is True
    res = CliRunner().invoke(app, ["plan", "--preset", "qwen3.6-27b", "--gate",
                                   "--set", "training.tokens_per_step=32768"])
    assert res.exit_code == 3 and "training.tokens_per_step (now 32,768" in res.output


def test_local_cpu_presets_have_no_memory_gate():
    plan = make_plan(load_config(preset="tiny"))
    assert all(m["fits"] is None for m in plan["memory"].values())
    assert plan["gate"] is None
    assert "drafter.num_heads" in plan["memory"]["trainer"]["assumed"]


def test_calibrate_replaces_rates_and_names_the_source():
    args = ["plan", "--preset", "qwen3.6-27b", "--set", "pools.trainer.gpu_type=h200"]
    plain = json.loads(CliRunner().invoke(app, args + ["--json"]).output)
    res = CliRunner().invoke(app, args + ["--calibrate", str(H200), "--json"])
    assert res.exit_code == 0, res.output
    cal = json.loads(res.output)
    hours = cal["gpu_hours"]
    assert "measured 3,159 tokens/s" in hours["train"]["rate_source"] and "b5e99d6" in hours["train"]["rate_source"]
    assert hours["train"]["tokens_per_s_per_gpu"] != plain["gpu_hours"]["train"]["tokens_per_s_per_gpu"]
    assert "measured" in hours["extract"]["rate_source"]
    assert hours["generate"]["rate_source"] == "assumed (model)"  # the file has no generation rate
    train = cal["memory"]["trainer"]
    assert train["measured_factor"] > 1 and "measured at" in train["peak_source"]
    assert train["peak_bytes_per_gpu"] > plain["memory"]["trainer"]["peak_bytes_per_gpu"]
    table = CliRunner().invoke(app, args + ["--calibrate", str(H200)])
    assert "calibration: one lent NVIDIA H200" in table.output and "assumed (model)" in table.output
    # an explicit plan.measured_tokens_per_s still wins over the file
    both = CliRunner().invoke(app, args + ["--calibrate", str(H200), "--set", "plan.measured_tokens_per_s.train=1000",
                                           "--json"])
    assert json.loads(both.output)["gpu_hours"]["train"]["tokens_per_s_per_gpu"] == 1000


def test_gpu_check_calibration_of_the_production_step_loads_with_its_recompute_modes():
    cal = json.loads((ROOT / "benchmarks" / "calibration" / "h200-2026-12-04-production.json").read_text())
    modes = [m["shape"]["activation_checkpointing"] for m in cal["train_memory"]]
    assert set(modes) == {"none", "mlp", "layer"}  # and the eager-loss A/B, again "none"
    plan = make_plan(load_config(preset="qwen3.6-27b", overrides={
        "pools.trainer.gpu_type": "h200", "training.activation_checkpointing": "mlp",
        "plan.calibration": str(ROOT / "benchmarks" / "calibration" / "h200-2026-12-04-production.json")}))
    assert "5 x 5120, 512 anchors a sample, 8,192 tokens a step" in plan["memory"]["trainer"]["peak_source"]


def test_calibrate_bad_file_names_it(tmp_path):
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({"schema_version": 1}))
    res = CliRunner().invoke(app, ["plan", "--preset", "qwen3.6-27b", "--calibrate", str(bad)])
    assert res.exit_code == 2 and "cal.json" in res.output and "source" in res.output


def test_bench_memory_child_runs_the_trainer_step_on_a_tiny_shape():
    spec = importlib.util.spec_from_file_location("bench_memory", ROOT / "benchmarks" / "bench_memory.py")
    bench = sys.modules["bench_memory"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = bench.compare("small", bench.SMALL)
    assert row["measured_bytes"] > 0 and row["predicted_bytes"] > 0 and row["anchors_per_row"] > 0
    assert row["phase"] in ("forward: last layer's dense mask", "loss", "backward", "optimizer step")
    assert "| small | 64 x 1 |" in bench.table([row])
