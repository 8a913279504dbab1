"""Done-when check on the real 135M chat model: after a short training, the trained drafter's tau beats the
untrained baseline's, and speculative decoding stays lossless. Every stage runs for real (the session's
smollm2_run, minutes on 2 cores)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def test_trained_drafter_beats_the_untrained_baseline(smollm2_run):
    metrics = smollm2_run["metrics"]
    assert metrics.lossless.passed, metrics.lossless
    assert metrics.drafter.tau > metrics.baseline.tau >= 1.0
    assert smollm2_run["report"].metrics["tau"] == metrics.drafter.tau
