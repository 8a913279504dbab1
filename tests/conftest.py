"""Shared fixtures: stores on every backend, a real S3 server on loopback, the tiny preset."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from support.mlflow_server import mlflow_server_command
from support.s3 import aws_env, free_port, rclone_command, wait_for_port
from support.shared_runs import SHARED_RUNS

from flashdraft.config import StorageConfig, load_config
from flashdraft.storage.store import ObjectStore

# Runs several modules read, made once per session (tests/support/shared_runs.py), the report tests' runs, the
# chart's renders and the test Hub server (olah serving local repositories: tests/support/hub_server.py)
pytest_plugins = ["support.shared_runs", "support.report_runs", "support.helm_chart", "support.hub_server"]

@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (rclone serve s3) on 127.0.0.1 with credentials; yields its endpoint URL.

    The bucket is a folder inside the served directory. Stopped at the end of the session.
    """
    data = tmp_path_factory.mktemp("s3data")
    (data / "flashdraft-test").mkdir()
    port = free_port()
    proc = subprocess.Popen(rclone_command(data, port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    endpoint = f"http://127.0.0.1:{port}"
    if not wait_for_port(port, proc):
        if proc.poll() is not None:
            pytest.fail(f"rclone serve s3 exited: {proc.stderr.read().decode()[-2000:]}")
        proc.kill()
        pytest.fail("rclone serve s3 did not start within 30 s")
    yield endpoint
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on 127.0.0.1 (sqlite backend, local artifacts); yields its URI."""
    data = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = (data / "server.log").open("wb")
    proc = subprocess.Popen(mlflow_server_command(data, port), stdout=log, stderr=subprocess.STDOUT)
    if not wait_for_port(port, proc, timeout_s=120):
        proc.kill()
        pytest.fail(f"mlflow server did not start: {(data / 'server.log').read_text()[-2000:]}")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture()
def s3_env(s3_server, monkeypatch):
    aws_env(monkeypatch)
    return s3_server


@pytest.fixture()
def s3_storage(s3_env) -> StorageConfig:
    """A fresh prefix in the test bucket on the real S3 server."""
    return StorageConfig(root=f"s3://flashdraft-test/{uuid.uuid4().hex[:10]}", endpoint_url=s3_env)


@pytest.fixture(params=["memory", "file", "s3"])
def any_store(request, tmp_path) -> ObjectStore:
    """The same store tests run on memory://, file:// and a real S3 server."""
    if request.param == "memory":
        return ObjectStore(f"memory://t-{uuid.uuid4().hex[:10]}")
    if request.param == "file":
        return ObjectStore(f"file://{tmp_path}/store")
    storage = request.getfixturevalue("s3_storage")
    return ObjectStore(storage.root, storage)


@pytest.fixture()
def tiny_cfg(tmp_path):
    """The tiny preset writing into this test's own folder."""
    return load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs"})


@pytest.fixture(autouse=True, scope="session")
def _threads():
    import torch

    torch.set_num_threads(int(os.environ.get("FLASHDRAFT_TEST_THREADS", "2")))


# Test tiers are folders: every test under tests/integration, tests/vllm or tests/k8s carries that tier's marker
# (so `-m "not integration"` can never pick up a test that needs a service), and tests/unit uses no real service.
TIER_FOLDERS = ("integration", "vllm", "k8s", "containers")
# The real servers; every real-S3 fixture depends on s3_server, every test-Hub one on hub_server
SERVICE_FIXTURES = {"s3_server", "mlflow_server", "hub_server"}


def xdist_group(item: pytest.Item) -> str:
    """`make test` runs two pytest-xdist workers (`--dist loadgroup`), and each worker is a session of its own: a
    session fixture read on both would be built twice. So a test that reads one of the shared runs
    (tests/support/shared_runs.py) runs on that run's worker, any other test on the worker of its file (its module
    fixtures are built once)."""
    return next((name for name in SHARED_RUNS if name in item.fixturenames), item.nodeid.split("::")[0])


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker, and before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else None
        if folder in TIER_FOLDERS:
            item.add_marker(folder)
        elif folder == "unit" and SERVICE_FIXTURES & set(item.fixturenames):
            raise pytest.UsageError(f"{item.nodeid} uses a real service ({', '.join(SERVICE_FIXTURES)}): tests/unit "
                                    "uses none; move it to tests/integration")
