"""Muon on FSDP2 shards (components/train/optim.py `WholeMatrixMuon`) gives the unsharded update exactly."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_muon_on_fsdp2_shards_equals_muon_on_the_whole_matrices():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "muon_shards.py"), str(port)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    diffs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert diffs == {"0.weight": 0.0, "1.weight": 0.0}
