"""`make test`'s two xdist workers build each shared run once: every session fixture of tests/support/shared_runs.py
is an xdist group (SHARED_RUNS, tests/conftest.py) or is built on one that is, so all its readers share one worker."""

from __future__ import annotations

import re
from pathlib import Path

from support.shared_runs import SHARED_RUNS

SOURCE = Path(__file__).resolve().parents[1] / "support" / "shared_runs.py"


def test_every_shared_run_is_one_workers_group(request):
    fixtures = re.findall(r'@pytest\.fixture\(scope="session"\)\ndef (\w+)\(([^)]*)\)', SOURCE.read_text())
    assert len(fixtures) >= len(SHARED_RUNS)
    for name, params in fixtures:
        args = {a.strip() for a in params.split(",")}
        assert name in SHARED_RUNS or args & set(SHARED_RUNS), f"{name}: add it to SHARED_RUNS or build it on one"
    # this test reads no shared run: its group is its file
    assert request.node.get_closest_marker("xdist_group").args[0] == "tests/unit/test_shared_run_groups.py"
