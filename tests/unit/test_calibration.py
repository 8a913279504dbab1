"""The calibration file's schema (flashdraft/perf/calibration.py): round trip, and errors that name file and field."""

import json
from pathlib import Path

import pytest

from flashdraft.perf.calibration import CalibrationError, load_calibration, save_calibration

EXAMPLE = Path(__file__).resolve().parents[2] / "benchmarks" / "calibration" / "h200-2026-12-04.json"


def test_checked_in_h200_example_loads_and_round_trips(tmp_path):
    cal = load_calibration(EXAMPLE)
    assert cal.gpu.gpu_type == "h200"
    assert cal.rates.train.tokens_per_s_per_gpu == 3159
    assert cal.rates.train.shape.max_anchors == 512 and cal.rates.generate is None
    assert [m.out_of_memory for m in cal.train_memory].count(True) == 1
    again = load_calibration(save_calibration(cal, tmp_path / "c.json"))
    assert again == cal
    assert "commit b5e99d6" in cal.origin()


def test_unknown_or_missing_fields_are_named(tmp_path):
    data = json.loads(EXAMPLE.read_text())
    data["rates"]["train"]["tokens_per_s"] = data["rates"]["train"].pop("tokens_per_s_per_gpu")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(CalibrationError) as exc:
        load_calibration(bad)
    assert "bad.json" in str(exc.value)
    assert "rates.train.tokens_per_s_per_gpu" in str(exc.value) and "rates.train.tokens_per_s" in str(exc.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(CalibrationError, match="not found"):
        load_calibration(tmp_path / "none.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(CalibrationError, match="x.json: invalid JSON"):
        load_calibration(tmp_path / "x.json")


def test_a_generate_rate_with_bytes_per_token_carries_as_a_share_of_the_memory_bandwidth(tmp_path):
    """Decode reads the weights once a step: a measured rate x its bytes a token is a share of the measuring GPU's
    bandwidth, which the plan applies to its own target, batch and inference GPU (make gpu-e2e's generate rate)."""
    from flashdraft.components.plan.gpus import GPUS
    from flashdraft.components.plan.planner import make_plan
    from flashdraft.config import load_config

    data = json.loads(EXAMPLE.read_text())
    data["rates"]["generate"] = {"tokens_per_s_per_gpu": 480.0, "bytes_per_token": 1e9,
                                 "shape": {"model": "stand-in", "batch": 4}}
    path = tmp_path / "gen.json"
    path.write_text(json.dumps(data))
    cfg = load_config(preset="qwen3.6-27b")
    plan = make_plan(cfg.with_overrides({"plan.calibration": str(path)}))
    gen = plan.gpu_hours["generate"]
    assert gen.rate_source.startswith("measured 480 tokens/s")
    assert "10.0% of the memory bandwidth" in gen.rate_source
    # 480 x 1e9 B / 4.8 TB/s (H200) = 10%; the plan's GPU (RTX PRO 6000) at 10% over its 27B bf16 weights / batch
    weights = plan.target_geometry.params * 2 / cfg.plan.decode_batch
    expected = 0.10 * GPUS["rtx-pro-6000"].bandwidth_gbs * 1e9 / weights
    assert gen.tokens_per_s_per_gpu == pytest.approx(expected, rel=1e-3)
    # without bytes_per_token a rate from another GPU type is not used
    del data["rates"]["generate"]["bytes_per_token"]
    path.write_text(json.dumps(data))
    plain = make_plan(cfg.with_overrides({"plan.calibration": str(path)}))
    assert plain.gpu_hours["generate"].rate_source == "assumed (model)"
