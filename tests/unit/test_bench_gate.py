"""The codec quality gate's verdict (benchmarks/bench_train.py `paired_verdict`, issue 24): per-seed relative tau
changes against lossless -> pass / miss / inconclusive under a 95% Student-t interval of their mean."""

import importlib.util
import math
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_train.py"
    spec = importlib.util.spec_from_file_location("bench_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("df", "exact"), [(1, 12.706), (2, 4.303), (10, 2.228), (11, 2.201), (20, 2.086),
                                           (30, 2.042), (120, 1.980), (10_000, 1.960)])
def test_t975_matches_the_students_t_table(bench, df, exact):
    assert bench.t975(df) == pytest.approx(exact, rel=1e-3)


def test_t975_refuses_zero_degrees_of_freedom(bench):
    with pytest.raises(ValueError, match="degrees of freedom"):
        bench.t975(0)


def test_three_noisy_seeds_that_lean_up_are_inconclusive_not_a_pass(bench):
    """fp4 e4m3/32 + 8 outliers at 1200 steps (2026-12-05): +1.9%, +10.6%, +0.5% against lossless. Two standard
    errors (+-6.3%) would call it a pass; the t interval (+-13.6%) says the three seeds cannot tell."""
    drop, noise, verdict = bench.paired_verdict([0.018757, 0.106454, 0.005274])
    assert drop == pytest.approx(-0.0435, abs=1e-4)
    assert noise == pytest.approx(4.303 * 0.0552 / math.sqrt(3), rel=0.01)
    assert verdict == "inconclusive"


def test_a_consistent_small_change_passes_and_a_consistent_large_drop_misses(bench):
    assert bench.paired_verdict([-0.004, -0.006, -0.005, -0.005])[2] == "pass"
    assert bench.paired_verdict([-0.05, -0.06, -0.055])[2] == "miss"


def test_one_seed_is_always_inconclusive(bench):
    drop, noise, verdict = bench.paired_verdict([0.001])
    assert math.isinf(noise) and verdict == "inconclusive"
