"""The real MLflow tracking server the fixtures start: `mlflow server` from its own venv (make mlflow-venv: the
full server pins older pyarrow and cryptography than flashdraft's venv holds; flashdraft talks to it with
mlflow-skinny), a sqlite backend and a local artifact root, on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MLFLOW_VENV = REPO / ".venv-mlflow"


def mlflow_server_command(data: Path, port: int) -> list[str]:
    binary = MLFLOW_VENV / "bin" / "mlflow"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run `make mlflow-venv` (make test builds it)")
    return [str(binary), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{data}/mlflow.db", "--default-artifact-root", f"file://{data}/artifacts"]
