"""The store preflight: before any stage runs, a bad store ends the command in seconds with one line that names
the setting to fix and exit 1 (real S3 server: tests/conftest.py's rclone; a closed port for an absent server)."""

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flashdraft.config import StorageConfig, load_config
from flashdraft.pipelines.pipeline import compile_pipeline
from flashdraft.storage.store import ObjectStore, StorePreflightError, preflight

pytestmark = pytest.mark.integration

FLASHDRAFT = str(Path(sys.executable).parent / "flashdraft")


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _no_credentials(monkeypatch, tmp_path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "FLASHDRAFT_S3_SECRET_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_preflight_passes_and_leaves_nothing_behind(s3_storage, tmp_path):
    preflight(s3_storage, "run-1")
    assert ObjectStore(s3_storage.root, s3_storage).list() == []
    preflight(StorageConfig(root=f"file://{tmp_path}/runs"), "run-1")
    assert [p.name for p in (tmp_path / "runs").rglob("*")] == ["run-1"]  # the run folder, no probe


def test_missing_bucket_names_the_bucket(s3_env):
    storage = StorageConfig(root=f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/x", endpoint_url=s3_env)
    with pytest.raises(StorePreflightError, match=r"bucket 'no-such-bucket-\w+' does not exist: create it, or fix "
                                                  r"storage.root"):
        preflight(storage, "run-1")


def test_wrong_secret_names_the_credentials(s3_storage, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StorePreflightError, match="refused the credentials.*AWS_SECRET_ACCESS_KEY"):
        preflight(s3_storage, "run-1")


def test_no_credentials_is_refused_before_any_request(s3_storage, monkeypatch, tmp_path):
    _no_credentials(monkeypatch, tmp_path)
    with pytest.raises(StorePreflightError, match="no S3 credentials found: set AWS_ACCESS_KEY_ID"):
        preflight(s3_storage, "run-1")


def test_unreachable_server_fails_in_seconds(s3_env):
    storage = StorageConfig(root="s3://bkt/x", endpoint_url=f"http://127.0.0.1:{_closed_port()}")
    t0 = time.monotonic()
    with pytest.raises(StorePreflightError, match=r"does not answer \(EndpointConnectionError.*start the S3 server "
                                                  r"or fix storage.endpoint_url"):
        preflight(storage, "run-1")
    assert time.monotonic() - t0 < 15  # one short retry, not the stages' retry budget (~16 s of backoff)


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([FLASHDRAFT, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["run-local"], ["prep", "--preset", "tiny"]])
def test_commands_that_start_work_stop_with_one_line(command, s3_env, tmp_path, monkeypatch):
    """The issue's transcript: run-local (and a stage command) on an S3 root without credentials, then with
    credentials but no server, then with a bucket that does not exist."""
    bad = ["--set", "storage.root=s3://bkt/x", "--set", f"storage.endpoint_url=http://127.0.0.1:{_closed_port()}"]
    _no_credentials(monkeypatch, tmp_path)
    line = _one_line_error(_run([*command, *bad], dict(os.environ), tmp_path))
    assert "storage.root=s3://bkt/x" in line and "no S3 credentials found" in line
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "flashdraft-test", "AWS_SECRET_ACCESS_KEY": "flashdraft-test-secret"}
    t0 = time.monotonic()
    line = _one_line_error(_run([*command, *bad], env, tmp_path))
    assert "does not answer" in line and "fix storage.endpoint_url" in line
    assert time.monotonic() - t0 < 60  # was 44 s of retries after a traceback; now the preflight's one retry
    missing = ["--set", "storage.root=s3://missing-bucket/x", "--set", f"storage.endpoint_url={s3_env}"]
    line = _one_line_error(_run([*command, *missing], env, tmp_path))
    assert "bucket 'missing-bucket' does not exist" in line
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_config_errors_are_one_line_and_exit_1(tmp_path):
    line = _one_line_error(_run(["prep", "--preset", "tiny", "--set", "drafter.block_size=1", "--set",
                                 "training.lr=-1"], dict(os.environ), tmp_path))
    assert "drafter.block_size: Input should be greater than or equal to 2; training.lr:" in line


@pytest.mark.parametrize("command", [
    ["status", "--run", "s3://bkt/x/tiny"], ["report", "--run", "s3://bkt/x/tiny"],
    ["status", "--preset", "tiny"], ["features", "verify", "--preset", "tiny"], ["report", "--preset", "tiny"]])
def test_commands_that_read_a_run_stop_with_one_line(command, tmp_path, monkeypatch):
    """The inspecting commands on an S3 store without credentials, then with a dead endpoint (a closed port):
    one line within seconds naming what to fix (--run/--endpoint-url or the storage.* setting), exit 1, and no
    advice to rerun a stage (was: a 106-line traceback, then 13.6 s of retries ending in stage advice)."""
    dead = f"http://127.0.0.1:{_closed_port()}"
    by_run = "--run" in command
    bad = ["--endpoint-url", dead] if by_run else ["--set", "storage.root=s3://bkt/x", "--set",
                                                    f"storage.endpoint_url={dead}"]
    setting = "--run s3://bkt/x/tiny" if by_run else "storage.root=s3://bkt/x"
    _no_credentials(monkeypatch, tmp_path)
    line = _one_line_error(_run([*command, *bad], dict(os.environ), tmp_path))
    assert line.startswith(f"{setting} (endpoint {dead}): no S3 credentials found"), line
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "flashdraft-test", "AWS_SECRET_ACCESS_KEY": "flashdraft-test-secret"}
    t0 = time.monotonic()
    line = _one_line_error(_run([*command, *bad], env, tmp_path))
    assert time.monotonic() - t0 < 30
    assert "does not answer" in line and f"fix {'--endpoint-url' if by_run else 'storage.endpoint_url'}" in line
    assert "rerun the stage" not in line


def test_submit_to_a_dead_kfp_endpoint_is_one_line(tmp_path):
    compile_pipeline(load_config(preset="tiny"), str(tmp_path / "p.yaml"), registry="reg.example", tag="t1")
    t0 = time.monotonic()
    line = _one_line_error(_run(["submit", "--package", str(tmp_path / "p.yaml"), "--host",
                                 f"http://127.0.0.1:{_closed_port()}"], dict(os.environ), tmp_path))
    assert time.monotonic() - t0 < 30
    assert line.startswith("the KFP API at http://127.0.0.1:") and "does not answer" in line and "--host" in line


def test_a_stage_failing_on_a_known_error_is_one_line(tmp_path):
    """The runner logs a failed task's traceback for its task log; a hand-run stage command keeps it off the
    terminal when the failure is one a person fixes (here: generate before prep), so the red line stands alone."""
    line = _one_line_error(_run(["generate", "--shard", "0", "--preset", "tiny", "--set",
                                 f"storage.root=file://{tmp_path}/runs"], dict(os.environ), tmp_path))
    assert line == f"file://{tmp_path}/runs/tiny/prompts/manifest.json is missing: run `flashdraft prep` first"
