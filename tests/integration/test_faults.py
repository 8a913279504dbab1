"""Under faults: a misbehaving object store, processes killed in loops, a full or read-only disk. Committed output
must equal a clean run's, nothing lost, nothing duplicated, nothing half-committed visible.

Every stage runs for real on the tiny target against the real S3 server (rclone serve s3), through the seeded
fault-injecting proxy in tests/support/s3proxy.py. The figures each test measured (requests, faults by kind, retries,
kills, mismatches) are printed as one `FAULT-FIGURES {json}` line (`pytest -rA` shows them).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.s3 import aws_env, free_port, rclone_command, wait_for_port
from support.s3proxy import FaultPlan, S3FaultProxy

from flashdraft.components.export.card import CARD_FILE
from flashdraft.components.export.export import exported_formats, read_export
from flashdraft.config import RunConfig, load_config
from flashdraft.features.manifest import committed_parts
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore, StoreUnavailableError, open_store

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# Small enough for 2 cores, big enough that every stage makes many requests: 2 generation shards of 4 samples,
# one sample per feature part, a checkpoint every step. Backoffs are short so a test rides out faults quickly.
TINY = {"data.max_samples": 8, "data.eval_count": 1, "data.num_shards": 2, "data.max_response_tokens": 8,
        "generation.chunk_size": 2, "features.batch_tokens": 48, "features.shard_bytes": 32768,
        "training.epochs": 1, "training.tokens_per_step": 128, "training.checkpoint_every": 1,
        "drafter.max_anchors": 4, "drafter.block_size": 4, "eval.num_prompts": 1, "eval.max_new_tokens": 4,
        "storage.retry_base_s": 0.02, "storage.retry_max_s": 0.5}
# max_steps above what the data gives: the end of the stream, not the schedule, ends training (every sample is used)
STREAMING = {"mode.kind": "streaming", "mode.reuse": 2, "mode.window_shards": 3, "mode.window_bytes": 400_000,
             "training.max_steps": 1000}
FAULT_RATE = 0.15


def figures(name: str, **values) -> None:
    print(f"FAULT-FIGURES {json.dumps({'test': name, **values}, sort_keys=True)}")


def make_cfg(endpoint: str, name: str, **over) -> RunConfig:
    """A run under a fixed prefix: the proxy's decisions hash the request path, so fixed names (and the seed)
    make the injected faults repeat from one session to the next."""
    root = f"s3://flashdraft-test/faults-{name}"
    return load_config(preset="tiny", overrides={"storage.root": root, "storage.endpoint_url": endpoint, **TINY,
                                                 **over})


def direct(cfg: RunConfig, endpoint: str) -> ObjectStore:
    """The run's store straight on the S3 server, bypassing the proxy: what is really committed."""
    return open_store(cfg.storage.model_copy(update={"endpoint_url": endpoint}), cfg.run_id)


def run_pipeline(cfg: RunConfig) -> None:
    """Every stage in order, in this process (streaming: producers in a subprocess, as run-local does)."""
    from flashdraft.components.evaluate.evaluate import run_evaluate
    from flashdraft.components.export.export import run_export
    from flashdraft.components.extract.extract import run_extract
    from flashdraft.components.generate.generate import run_generate
    from flashdraft.components.prep.prep import run_prep
    from flashdraft.components.train.trainer import run_train
    from flashdraft.pipelines.runtime import train_with_producers

    shards = run_prep(cfg).num_shards
    for shard in range(shards):
        run_generate(cfg, shard)
    if cfg.mode.kind == "streaming":
        train_with_producers(cfg)
    else:
        for shard in range(shards):
            run_extract(cfg, shard)
        run_train(cfg)
    run_evaluate(cfg)
    run_export(cfg)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def committed_outputs(store: ObjectStore, cfg: RunConfig) -> dict[str, str]:
    """sha256 of everything a run commits that must not depend on faults: responses, feature parts (streaming:
    as recorded when produced, since the trainer deletes them), the feature manifest, the final weights, the
    export. Every committed object is read back verified."""
    from flashdraft.storage.checkpoint import latest_checkpoint

    out = {k: sha(store.get_verified(k)) for k in store.list_committed(f"{layout.RESPONSES}/")
           if k.endswith(".parquet")}
    if cfg.mode.kind == "streaming":
        for shard in range(cfg.data.num_shards):
            for part in store.get_json_verified(layout.features_done_key(shard))["parts"]:
                out[part["key"]] = part["sha256"]
    else:
        out.update({k: sha(store.get_verified(k)) for k in committed_parts(store)})
        out[layout.FEATURES_MANIFEST] = sha(store.get_verified(layout.FEATURES_MANIFEST))
    latest = latest_checkpoint(store)
    assert latest and latest["final"]
    out["weights"] = sha(store.get_verified(f"{latest['prefix']}/model.safetensors"))
    for fmt in exported_formats(store):  # the served files, verified; the model card names its run, which differs
        out.update({f"{layout.export_prefix(fmt)}{n}": sha(d) for n, d in read_export(store, fmt).items()
                    if n != CARD_FILE})
    return out


def caused_by(exc: BaseException | None, cls: type) -> bool:
    """`exc` is a `cls`, or a stage's error raised from one (extraction wraps its writer thread's error)."""
    while exc is not None and not isinstance(exc, cls):
        exc = exc.__cause__
    return exc is not None


def half_committed(store: ObjectStore) -> list[str]:
    """Committed keys whose bytes are missing or disagree with their record (must always be empty)."""
    bad = []
    for key in store.list_committed(""):
        try:
            store.get_verified(key)
        except Exception as exc:  # noqa: BLE001 - any failure to read a committed object is the finding
            bad.append(f"{key}: {type(exc).__name__}")
    return bad


def store_io(store: ObjectStore) -> dict[str, int]:
    """Sum of the store_io counters every stage recorded in metrics/."""
    total: dict[str, int] = {}
    for key in store.list_committed(f"{layout.METRICS}/"):
        for k, v in store.get_json_verified(key).get("store_io", {}).items():
            total[k] = total.get(k, 0) + v
    return total


@pytest.fixture(scope="module")
def clean_runs(s3_server):
    """Clean runs straight on the S3 server, made on first use: clean_runs[kind] = (config, outputs)."""

    class Runs(dict):
        def __missing__(self, kind: str):
            with pytest.MonkeyPatch.context() as mp:
                _aws(mp)
                cfg = make_cfg(s3_server, f"clean-{kind}", **(STREAMING if kind == "streaming" else {}))
                run_pipeline(cfg)
                self[kind] = (cfg, committed_outputs(direct(cfg, s3_server), cfg))
            return self[kind]

    return Runs()



def _aws(mp: pytest.MonkeyPatch) -> None:
    aws_env(mp)


@pytest.mark.parametrize("kind", ["offline", "streaming"])
def test_every_stage_through_a_faulty_store_commits_what_a_clean_run_does(kind, clean_runs, s3_server,
                                                                          monkeypatch, caplog):
    _aws(monkeypatch)
    proxy = S3FaultProxy(s3_server, FaultPlan.mixed(seed=16, rate=FAULT_RATE))
    try:
        # 10 retries, not the default 6: with these short backoffs the first ~5 tries of an operation that starts
        # as the 0.3 s outage begins can all land in it, and 6 retries then left 2-3 tries to clear 15% random
        # faults (a 0.3-2% chance to give up per such operation; the streaming run's window monitor, listing 10x a
        # second, gave up once in CI). 10 leave 6+ (< 2e-5); giving up past the budget is
        # test_a_store_down_past_the_retry_budget's.
        cfg = make_cfg(proxy.endpoint, f"faulty-{kind}", **(STREAMING if kind == "streaming" else {}),
                       **{"storage.retries": 10})
        proxy.outage_after(lambda method, path: method == "PUT" and path.endswith(".fds"), seconds=0.3)
        with caplog.at_level("WARNING", logger="flashdraft.storage.store"):
            run_pipeline(cfg)
    finally:
        proxy.close()
    store = direct(cfg, s3_server)
    got = committed_outputs(store, cfg)
    want = clean_runs[kind][1]
    mismatches = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    injected = proxy.injected()
    io = store_io(store)
    figures(f"faulty store, {kind}", injected=injected, store_io=io, mismatches=len(mismatches),
            retry_log_lines=sum("retry" in r.getMessage() for r in caplog.records))
    assert mismatches == [], mismatches
    faults = sum(v for k, v in injected.items() if k not in ("requests", "outages"))
    assert faults >= 0.1 * injected["requests"] and injected.get("outage", 0) > 0, injected
    assert injected.get("corrupt", 0) > 0, "some reads came back corrupted: only the checksum stands in the way"
    assert io["retries"] > 0 and io["gave_up"] == 0, io
    assert any("retry 1/" in r.getMessage() for r in caplog.records), "retries are logged"


def seed_from(src: ObjectStore, dst: ObjectStore, prefixes=(layout.PROMPTS, layout.RESPONSES)) -> None:
    """Copy a finished run's prompts and responses (objects and commit records, byte for byte) into `dst`, so a
    test of a later stage starts where generation ended without generating again."""
    for prefix in prefixes:
        for key in src.list(f"{prefix}/"):
            dst.put(key, src.get(key))


def part_shas(store: ObjectStore, cfg: RunConfig) -> dict[str, str]:
    """Feature parts of a finished extraction, as recorded in the shards' DONE summaries."""
    return {p["key"]: p["sha256"] for shard in range(cfg.data.num_shards)
            for p in store.get_json_verified(layout.features_done_key(shard))["parts"]}


def test_a_store_down_past_the_retry_budget_fails_the_stage_clearly_and_commits_nothing_half(
        clean_runs, s3_server, monkeypatch):
    from flashdraft.components.extract.extract import run_extract

    _aws(monkeypatch)
    ref_cfg, ref = clean_runs["offline"]
    proxy = S3FaultProxy(s3_server)
    try:
        cfg = make_cfg(proxy.endpoint, "down", **{"storage.retries": 3})
        seed_from(direct(ref_cfg, s3_server), direct(cfg, s3_server))
        # The store goes down for good at the second feature part's upload.
        puts = iter(range(10**6))
        proxy.outage_after(lambda m, p: m == "PUT" and p.endswith(".fds") and next(puts) == 1, seconds=None)
        with pytest.raises(Exception) as exc:  # noqa: B017 - the store error, possibly wrapped by the stage
            run_extract(cfg, 0)
        message = str(exc.value)
        assert caused_by(exc.value, StoreUnavailableError), repr(exc.value)
        assert "features/shard-00000/part-00001.fds" in message and "failed 4 times" in message, message
        store = direct(cfg, s3_server)
        assert half_committed(store) == []
        assert committed_parts(store) == ["features/shard-00000/part-00000.fds"]
        assert not store.is_committed(layout.features_done_key(0))
        proxy.restore()
        run_extract(cfg, 0)  # the store is back: the rerun resumes and completes
        run_extract(cfg, 1)
    finally:
        proxy.close()
    got = {k: sha(store.get_verified(k)) for k in committed_parts(store)}
    assert got == {k: v for k, v in ref.items() if k.endswith(".fds")}
    figures("store down past the retry budget", injected=proxy.injected(), mismatches=0, error=message[:160])


# A stage in its own interpreter, as a pipeline runs it; prints its summary (store_io included) as the last line.
_STAGE_PROCESS = ("import importlib, sys; from flashdraft.config import RunConfig; stage = sys.argv[1]; "
                  "run = getattr(importlib.import_module(f'flashdraft.components.{stage}.{stage}'), f'run_{stage}'); "
                  "print(run(RunConfig.model_validate_json(sys.argv[2])).model_dump_json())")
DECODED = ("tau", "cycles", "accepted", "tokens", "acceptance_per_position")  # evaluate's figures free of timings


def stage_process(stage: str, cfg: RunConfig) -> dict:
    done = subprocess.run([sys.executable, "-c", _STAGE_PROCESS, stage, cfg.model_dump_json()],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{stage} exited {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_evaluate_and_export_each_verify_the_checkpoint_they_read_when_every_process_gets_corrupt_bytes(
        clean_runs, s3_server, monkeypatch):
    """The proxy corrupts the first whole read of every data object in each client process, and evaluate and
    export run as separate processes (as in a pipeline), so each reads the committed checkpoint corrupted once:
    evaluate measures the drafter a clean read measures, export ships the clean run's files, each after
    re-reading (a plain read would have loaded another drafter, and the export manifest would bless it)."""
    from flashdraft.components.evaluate.evaluate import run_evaluate

    _aws(monkeypatch)
    ref_cfg, ref = clean_runs["offline"]
    fixed = {"eval.num_draft_tokens": 3}  # the timed choice of k would make tau differ between two evaluations
    proxy = S3FaultProxy(s3_server, FaultPlan(seed=3, corrupt=1.0, corrupt_per_process=True))
    try:
        cfg, clean = (make_cfg(endpoint, name, **fixed) for endpoint, name in
                      ((proxy.endpoint, "per-process"), (s3_server, "per-process-clean")))
        for run in (cfg, clean):  # everything up to a trained drafter, byte for byte
            seed_from(direct(ref_cfg, s3_server), direct(run, s3_server),
                      prefixes=(layout.PROMPTS, layout.RESPONSES, layout.FEATURES, layout.CHECKPOINTS))
        evaluated, exported = stage_process("evaluate", cfg), stage_process("export", cfg)
    finally:
        proxy.close()
    weights = f"{direct(cfg, s3_server).get_json_verified(layout.CHECKPOINT_LATEST)['prefix']}/model.safetensors"
    readers = {pid for pid, path in proxy.corrupted if path.endswith(weights)}
    want = run_evaluate(clean)
    got_export = {f"{layout.export_prefix(fmt)}{n}": sha(d) for fmt in exported_formats(direct(cfg, s3_server))
                  for n, d in read_export(direct(cfg, s3_server), fmt).items() if n != CARD_FILE}
    figures("corrupt first read per process", injected=proxy.injected(), weight_readers=len(readers),
            checksum_retries=[s["store_io"].get("retries_checksum", 0) for s in (evaluated, exported)])
    assert len(readers) == 2, f"evaluate and export each got the weights corrupted once: {proxy.corrupted}"
    assert all(s["store_io"].get("retries_checksum", 0) >= 1 for s in (evaluated, exported))
    assert {k: evaluated["drafter"][k] for k in DECODED} == {k: getattr(want.drafter, k) for k in DECODED}
    assert got_export == {k: v for k, v in ref.items() if k.startswith(f"{layout.EXPORT}/")}


WRITES = ("PUT", "POST", "DELETE")


class _KillPoint:
    """The proxy hook of one start: counts the start's store writes and SIGKILLs its process group at write `at`
    in `phase` ("sent": before the server sees it; "applied": after the server applied it, before the client hears
    back). Unarmed, it only counts."""

    def __init__(self, pid: int, at: int, phase: str, armed: bool):
        self.pid, self.at, self.phase, self.armed = pid, at, phase, armed
        self.writes = 0
        self.killed = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, when: str) -> bool:
        with self._lock:
            if self.killed.is_set():
                return True  # the rest of a killed group's requests die with it
            if method not in WRITES or when != self.phase:
                return False
            self.writes += 1
            if not self.armed or self.writes < self.at:
                return False
            # set before the kill: the test thread, woken by the death, must find it set
            self.killed.set()
            os.killpg(self.pid, signal.SIGKILL)  # run_stage made it a group leader before any store request
            return True


def _kill_loop(kind: str, cfg: RunConfig, proxy: S3FaultProxy, kills: int, seed: int, most_writes: int,
               watch=None) -> dict[str, int]:
    """Start the stage `kind` (tests/support/fault_workers.py) with its store behind `proxy`, and SIGKILL its process
    group at a seeded random point of its progress, `kills` times; then let it finish. Returns the kills, starts and
    store writes it took.

    A kill point is a store write, not a delay: each start is killed at its n-th write (n uniform in 1..most_writes),
    either before the write reaches the server or after the server applied it but before the client heard back
    (the exactly-once edge). Every start that gets past its first write makes progress, so the loop ends whatever
    the machine's speed; a timed kill either misses a fast machine's whole run or never lets a slow one progress."""
    import multiprocessing

    from support import fault_workers

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(fault_workers.PRELOAD)
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    rng = random.Random(seed)
    landed = starts = writes = 0
    while True:
        proc = ctx.Process(target=fault_workers.run_stage, args=(kind, cfg.model_dump_json(), env))
        at, phase = rng.randint(1, most_writes), rng.choice(("sent", "applied"))
        proc.start()
        starts += 1
        point = _KillPoint(proc.pid, at, phase, armed=landed < kills)
        proxy.intercept(point)
        proc.join(600)
        proxy.intercept(None)
        writes += point.writes
        if point.killed.is_set():
            proc.join()
            landed += 1
            if watch is not None:
                watch()
            continue
        assert proc.exitcode == 0, f"{kind} run {starts} exited with {proc.exitcode}"
        assert landed == kills, f"{kind} finished after {landed} of {kills} kills: lower most_writes"
        return {"kills": landed, "starts": starts, "writes": writes}


def test_extraction_killed_ten_times_commits_what_an_uninterrupted_run_does(clean_runs, s3_server, monkeypatch):
    _aws(monkeypatch)
    ref_cfg, ref = clean_runs["offline"]
    proxy = S3FaultProxy(s3_server)  # no faults: it only places the kills
    cfg = make_cfg(proxy.endpoint, "extract-kills")
    store = direct(cfg, s3_server)
    seed_from(direct(ref_cfg, s3_server), store)
    half = []
    try:  # an uninterrupted extraction makes 26 writes; these 10 seeded kill points can take at most 16 of them
        stats = _kill_loop("extract", cfg, proxy, kills=10, seed=16, most_writes=3,
                           watch=lambda: half.extend(half_committed(store)))
    finally:
        proxy.close()
    got = {k: sha(store.get_verified(k)) for k in committed_parts(store)}
    want = {k: v for k, v in ref.items() if k.endswith(".fds")}
    mismatches = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    figures("extraction kill loop", **stats, mismatches=len(mismatches), half_committed=len(half))
    assert half == [], "after a kill, every committed object reads back verified"
    assert mismatches == []
    manifest = layout.FEATURES_MANIFEST
    assert store.get_verified(manifest) == direct(ref_cfg, s3_server).get_verified(manifest)


def test_streaming_pair_killed_ten_times_trains_every_sample_exactly_reuse_times(clean_runs, s3_server,
                                                                                  monkeypatch):
    from flashdraft.features.window import released_part, stored_parts
    from flashdraft.storage.checkpoint import latest_checkpoint

    _aws(monkeypatch)
    ref_cfg, ref = clean_runs["streaming"]
    proxy = S3FaultProxy(s3_server)  # no faults: it only places the kills
    cfg = make_cfg(proxy.endpoint, "stream-kills", **STREAMING)
    store = direct(cfg, s3_server)
    seed_from(direct(ref_cfg, s3_server), store)
    peak = {"parts": 0, "bytes": 0}
    halt = threading.Event()

    def monitor() -> None:  # the window's bound, watched from outside across every restart
        while not halt.is_set():
            try:
                parts = stored_parts(store)
            except FileNotFoundError:
                continue
            peak["parts"] = max(peak["parts"], len(parts))
            peak["bytes"] = max(peak["bytes"], sum(parts.values()))
            halt.wait(0.05)

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    try:
        # the uninterrupted pair makes 274 writes; these 10 seeded kill points can take at most 21 of them
        stats = _kill_loop("stream", cfg, proxy, kills=10, seed=17, most_writes=4)
    finally:
        halt.set()
        watcher.join()
        proxy.close()
    a = direct(ref_cfg, s3_server).get_json_verified(layout.metrics_key("train"))
    b = store.get_json_verified(layout.metrics_key("train"))
    steps_a = [(h["step"], h["tokens"], round(h["loss"], 5)) for h in a["history"]]
    steps_b = [(h["step"], h["tokens"], round(h["loss"], 5)) for h in b["history"]]
    parts = {k: v for k, v in ref.items() if k.startswith(f"{layout.FEATURES}/")}
    got_parts = part_shas(store, cfg)
    mismatches = sorted(k for k in set(parts) | set(got_parts) if parts.get(k) != got_parts.get(k))
    weights = sha(store.get_verified(f"{latest_checkpoint(store)['prefix']}/model.safetensors"))
    mismatches += ["history"] * (steps_a != steps_b) + ["weights"] * (weights != ref["weights"])
    figures("streaming kill loop", **stats, mismatches=len(mismatches), peak_parts=peak["parts"],
            peak_bytes=peak["bytes"], window_shards=cfg.mode.window_shards, window_bytes=cfg.mode.window_bytes)
    # The same samples in the same steps, each `reuse` times, and the same weights as the uninterrupted run.
    assert mismatches == [], mismatches
    tokens = sum(released_part(store, k)["tokens"] for k in got_parts)
    assert sum(h["tokens"] for h in b["history"]) == tokens * cfg.mode.reuse, "every sample trained reuse times"
    assert committed_parts(store) == [] and all(released_part(store, k) for k in got_parts)
    assert 0 < peak["parts"] <= cfg.mode.window_shards and peak["bytes"] <= cfg.mode.window_bytes, peak
    assert len(got_parts) > cfg.mode.window_shards, "the run must produce more parts than the window holds"


def _rclone(data: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(rclone_command(data, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if wait_for_port(port, proc):
        return proc
    proc.kill()
    raise AssertionError("rclone did not start")


def test_s3_server_killed_and_restarted_mid_run_resumes_and_completes(clean_runs, s3_server, monkeypatch,
                                                                      tmp_path):
    from flashdraft.components.extract.extract import run_extract

    _aws(monkeypatch)
    ref_cfg, ref = clean_runs["offline"]
    (tmp_path / "s3" / "flashdraft-test").mkdir(parents=True)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = _rclone(tmp_path / "s3", port)
    # The retry budget must outlast a restart (~1-2 s under load): 6 retries from 0.25 s, capped at 2 s.
    cfg = make_cfg(endpoint, "server-restart", **{"storage.retry_base_s": 0.25, "storage.retry_max_s": 2.0})
    store = direct(cfg, endpoint)
    seed_from(direct(ref_cfg, s3_server), store)
    errors = []

    def extract_all() -> None:
        try:
            for shard in range(cfg.data.num_shards):
                run_extract(cfg, shard)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    worker = threading.Thread(target=extract_all)
    worker.start()
    restarts = 0
    try:
        for _ in range(2):  # twice, once the first parts are in
            deadline = time.time() + 120
            while len(committed_parts(store)) < 2 + 3 * restarts and worker.is_alive():
                assert time.time() < deadline
                time.sleep(0.05)
            if not worker.is_alive():
                break
            server.kill()
            server.wait()
            time.sleep(0.5)
            server = _rclone(tmp_path / "s3", port)
            restarts += 1
        worker.join(300)
    finally:
        server.kill()
    assert errors == [] and restarts >= 1
    server = _rclone(tmp_path / "s3", port)
    try:
        live = direct(cfg, endpoint)
        got = {k: sha(live.get_verified(k)) for k in committed_parts(live)}
        assert half_committed(live) == []
    finally:
        server.kill()
    want = {k: v for k, v in ref.items() if k.endswith(".fds")}
    figures("S3 server killed and restarted", restarts=restarts, mismatches=sum(got.get(k) != v for k, v in
                                                                                want.items()))
    assert got == want


@pytest.fixture()
def small_mount(tmp_path):
    """A real 256 KiB tmpfs (needs root or CAP_SYS_ADMIN; the test says so and skips where mounting is refused)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")

    def remount(opts: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{opts}", str(mnt)], check=True)

    yield mnt, remount
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_and_read_only_store_root_fail_clearly_and_a_rerun_completes(clean_runs, s3_server,
                                                                               monkeypatch, small_mount):
    from flashdraft.components.extract.extract import run_extract
    from flashdraft.storage.store import StoreFullError, StoreReadOnlyError

    _aws(monkeypatch)
    ref_cfg, ref = clean_runs["offline"]
    mnt, remount = small_mount
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{mnt}/runs", **TINY})
    store = open_store(cfg.storage, cfg.run_id)
    seed_from(direct(ref_cfg, s3_server), store)
    with pytest.raises(Exception, match=rf"{mnt}/runs/.*features/shard-0000\d/part-\d+\.fds.*no space left") as exc:
        for shard in range(cfg.data.num_shards):
            run_extract(cfg, shard)
    assert caused_by(exc.value, StoreFullError), repr(exc.value)
    assert half_committed(store) == [] and not [k for k in store.list("") if ".tmp-" in k]
    full_at = len(committed_parts(store))
    remount("ro")
    with pytest.raises(Exception, match=rf"{mnt}/runs/.*read-only") as exc:
        run_extract(cfg, 0)
    assert caused_by(exc.value, StoreReadOnlyError), repr(exc.value)
    remount("rw,size=8m")  # space freed
    for shard in range(cfg.data.num_shards):
        run_extract(cfg, shard)
    got = {k: sha(store.get_verified(k)) for k in committed_parts(store)}
    want = {k: v for k, v in ref.items() if k.endswith(".fds")}
    figures("full and read-only disk", parts_before_full=full_at,
            mismatches=sum(got.get(k) != v for k, v in want.items()))
    manifest = layout.FEATURES_MANIFEST
    assert got == want and store.get_verified(manifest) == direct(ref_cfg, s3_server).get_verified(manifest)


def test_plan_gate_stops_a_run_whose_planned_bytes_exceed_the_store_filesystem(small_mount, tmp_path):
    """Issue 48 item 5: the tiny run plans 5.8 MB at rest; on a 2 MB filesystem it passed the gate and failed at
    extract. Now the plan gate stops it before any other task, naming both figures and the path in one line, and
    the same config passes once the filesystem is larger."""
    from flashdraft.components.plan.planner import run_plan
    from flashdraft.pipelines.local import run_local

    mnt, remount = small_mount
    remount("size=2m")
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{mnt}/runs"})
    result = run_local(cfg, str(tmp_path / "kfp"))
    assert result["state"] == "FAILED"
    failure = result["failure"]
    assert failure.stage == "plan" and failure.error_type == "PlanGateError", failure
    assert "\n" not in failure.error and f"the filesystem of {mnt}" in failure.error
    assert "the plan needs 5.8 MB (5,773,996 B) at rest" in failure.error and " free: " in failure.error
    store = open_store(cfg.storage, cfg.run_id)
    assert not store.list(f"{layout.PROMPTS}/") and not store.list(f"{layout.RESPONSES}/"), "nothing ran after it"
    remount("size=16m")  # space grown
    assert run_plan(cfg).gate is None
