"""One writer per task and resume, through `flashdraft run-local` as a user runs it (subprocesses, kfp.local):

* two run-locals of one run_id started together: one is refused at the task the other holds, in one line naming
  the holder; the other completes, lossless;
* the run resubmitted after its export pod "died" mid-task (a running record, no result, the dead pod's lease)
  reuses every committed task and redoes only export, taking over the dead pod's lease.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.config import load_config
from flashdraft.run import status
from flashdraft.storage import layout
from flashdraft.storage.lease import lease_prefix
from flashdraft.storage.store import open_store

pytestmark = pytest.mark.integration

# Short lease timings so a refusal comes within seconds (defaults: 30 s heartbeat, 180 s expiry).
LEASE_SETS = {"storage.lease_heartbeat_s": "1", "storage.lease_expiry_s": "20"}


def _run_local(tmp_path: Path, name: str, sets: dict[str, str]) -> subprocess.Popen:
    args = [str(Path(sys.executable).parent / "flashdraft"), "run-local", "--preset", "tiny", "--workdir",
            str(tmp_path / f"kfp-{name}")]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def _finish(proc: subprocess.Popen) -> tuple[int, list[str]]:
    out, _ = proc.communicate(timeout=1500)
    return proc.returncode, [line for line in out.splitlines() if line.strip()]


def test_two_run_locals_of_one_run_id_one_refused_naming_the_holder_one_complete_then_resume(tmp_path):
    sets = {"storage.root": f"file://{tmp_path}/store", **LEASE_SETS}
    cfg = load_config(preset="tiny", overrides={k: float(v) if k in LEASE_SETS else v for k, v in sets.items()})
    store = open_store(cfg.storage, cfg.run_id)
    first, second = _run_local(tmp_path, "a", sets), _run_local(tmp_path, "b", sets)
    outcomes = sorted([_finish(first), _finish(second)], key=lambda o: o[0])
    (ok_rc, ok_lines), (refused_rc, refused_lines) = outcomes
    assert ok_rc == 0, "\n".join(ok_lines[-20:])
    assert refused_rc == 1, "\n".join(refused_lines[-20:])
    failed = [line for line in refused_lines if " FAILED " in line and "LeaseHeld: " in line]
    assert len(failed) == 1, "\n".join(refused_lines[-20:])  # the task's line: `HH:MM:SS  <task>  FAILED  ...`
    assert "another writer holds this task's lease: " in failed[0] and " pid " in failed[0], failed
    assert "renewed while this one waited" in failed[0], failed
    # the complete run: every task done, evaluated lossless
    records = {r.task: r for r in status.read_records(store)}
    assert all(r.state == "done" for r in records.values()), {t: r.state for t, r in records.items()}
    evaluation = EvaluateSummary.model_validate(store.get_json_verified(layout.metrics_key("evaluate")))
    assert evaluation.lossless.passed, evaluation.lossless
    assert all(json.loads(store.get(k))["released"] for k in store.list(f"{layout.LEASES}/")), "all released"

    # export's pod dies mid-task: its running record stays, its result is not committed, its lease not released
    export = records["export"]
    store.commit_json(status.status_key("export"), export.model_copy(update={"state": "running", "ended": None})
                      .model_dump(mode="json"))
    store.uncommit(layout.metrics_key("export"))
    now = time.time()
    dead = {"task": "export", "generation": 99, "token": "dead-pod", "host": "tiny-export-pod-x7k2p", "pid": 1,
            "started": now - 60, "renewed": now - 30, "expires": now - 5, "released": False}
    store.put(f"{lease_prefix('export')}{99:010d}.json", json.dumps(dead).encode())

    rc, lines = _finish(_run_local(tmp_path, "resume", sets))
    assert rc == 0, "\n".join(lines[-20:])
    after = {r.task: r for r in status.read_records(store)}
    redone = sorted(t for t, r in after.items() if not r.reused and t not in ("plan", "report"))  # never reused
    assert redone == ["export"], redone
    assert after["export"].state == "done" and after["export"].attempt == export.attempt + 1
    assert all(r.reused for t, r in after.items() if t not in ("export", "plan", "report")), after
    assert json.loads(store.get(f"{lease_prefix('export')}{100:010d}.json"))["released"], "the dead pod's taken over"
