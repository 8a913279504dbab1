"""The real helm binary (`make tools`) and the chart, for the tests that render it (a pytest plugin: the `helm`
fixture; tests/integration/test_helm_chart.py and test_cluster_contract.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "flashdraft"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
RELEASE, NAMESPACE = "flashdraft", "fd-test"


@pytest.fixture(scope="session")
def helm() -> str:
    exe = ROOT / ".tools" / "helm"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: run `make tools` (installs the real helm binary)")
    return str(exe)


def helm_run(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def value_args(values: Path | None, sets: dict[str, str] | None = None) -> list[str]:
    args = ["-f", str(values)] if values else []
    for key, val in (sets or {}).items():
        args += ["--set", f"{key}={val}"]
    return args


def render(helm: str, chart: Path, values: Path | None = None, sets: dict[str, str] | None = None) -> list[dict]:
    out = helm_run(helm, "template", RELEASE, str(chart), "-n", NAMESPACE, *value_args(values, sets)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def values_id(p: Path | None) -> str:
    return p.stem if p else "default"


def chart_run_config(helm: str, chart: Path, values: Path | None, preset: str = "qwen3.6-27b") -> str:
    """`make chart-pipeline`'s config step (`flashdraft chart-config`): the chart's defaults ConfigMap rendered from
    `values`, applied over `preset`, as a full run config."""
    from flashdraft.pipelines.chart_config import chart_run_config as from_configmap

    configmap = helm_run(helm, "template", RELEASE, str(chart), "-n", NAMESPACE, *value_args(values),
                         "--set", "pipeline.upload.enabled=false", "--show-only",
                         "templates/configmap-defaults.yaml").stdout
    return from_configmap(configmap, preset)
