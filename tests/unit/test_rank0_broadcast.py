"""`from_rank0` (components/train/distributed.py): the offline part list is computed on rank 0 only and every rank
gets rank 0's answer, or rank 0's error, never a wait in a broadcast that does not come. Two real gloo processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

_RANK = """
import json, os, sys
import torch.distributed as dist
from flashdraft.components.train.distributed import from_rank0

dist.init_process_group("gloo")
def compute():
    if sys.argv[1] == "fail":
        raise ValueError("features/shard-00000/part-00001.fds is missing")
    return {"parts": [["features/shard-00000/part-00000.fds", "ab" * 32, 10, "DONE"]], "pid": os.getpid()}
try:
    print(json.dumps(from_rank0(compute)))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
dist.destroy_process_group()
"""


def two_ranks(mode: str) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_PORT": str(port),
                                              "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"})
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_every_rank_gets_rank_zeros_answer():
    rank0, rank1 = two_ranks("ok")
    assert rank0 == rank1 and rank0["parts"][0][0] == "features/shard-00000/part-00000.fds"


def test_rank_zeros_error_reaches_every_rank():
    rank0, rank1 = two_ranks("fail")
    assert rank0 == {"error": "ValueError: features/shard-00000/part-00001.fds is missing"}
    assert rank1 == {"error": "RankZeroError: rank 0: ValueError: features/shard-00000/part-00001.fds is missing"}
