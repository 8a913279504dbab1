"""The real S3 server the fixtures start (`rclone serve s3` on loopback): its credentials and how to start one."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

S3_KEY, S3_SECRET = "flashdraft-test", "flashdraft-test-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def venv_bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: run `make install` (it comes from the dev extra)")
    return found


def aws_env(mp: pytest.MonkeyPatch) -> None:
    """The test server's credentials in the environment, as the store's clients read them."""
    mp.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    mp.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")


def rclone_command(data: Path, port: int) -> list[str]:
    return [venv_bin("rclone"), "serve", "s3", "--auth-key", f"{S3_KEY},{S3_SECRET}", "--addr",
            f"127.0.0.1:{port}", str(data)]


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 30) -> bool:
    """True once 127.0.0.1:port accepts a connection; False when `proc` exited or the time ran out."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            if proc.poll() is not None:
                return False
            time.sleep(0.1)
    return False
