"""The calibration file's schema (flashdraft/calibration.py): round trip, and errors that name file and field."""

import json
from pathlib import Path

import pytest

from flashdraft.calibration import CalibrationError, load_calibration, save_calibration

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
