"""Run `run_train` as ranks 0 and 1 of a gloo group (two real processes, as torchrun would start them)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

_CODE = ("import json, resource, sys; from flashdraft.config import RunConfig; "
         "from flashdraft.components.train.trainer import run_train; "
         "run_train(RunConfig.model_validate(json.loads(sys.argv[1])), stop_after=json.loads(sys.argv[2])); "
         "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")


def two_gloo_ranks(cfg, stop_after: int | None = None, timeout_s: float = 600) -> list[int]:
    """Train `cfg` on 2 gloo ranks, optionally preempted after step `stop_after`; returns each rank's peak RSS in
    bytes. A rank that fails stops the other (its peer would wait in a collective until the timeout), and the
    assertion carries every rank's stderr tail."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-c", _CODE, cfg.model_dump_json(), json.dumps(stop_after)]
    # output to files, not pipes: a rank's log past the pipe buffer would block it while we only poll
    logs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(2)]
    procs = [subprocess.Popen(args, stdout=out, stderr=err, text=True,
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
             for r, (out, err) in enumerate(logs)]
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()

    def read(f) -> str:
        f.seek(0)
        return f.read()

    results = [(p.returncode, read(out), read(err)) for p, (out, err) in zip(procs, logs, strict=True)]
    assert all(rc == 0 for rc, _, _ in results), "\n".join(f"rank {r} exit {rc}: {err[-3000:]}"
                                                         for r, (rc, _, err) in enumerate(results))
    return [int(out.strip().splitlines()[-1]) for _, out, _ in results]
