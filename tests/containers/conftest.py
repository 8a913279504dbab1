"""The containers tier's session: one private Docker engine, the wheel index, the stand-in base, the built images.

Every fixture fails (never skips) with one line saying what this machine lacks: a tier that skips on a machine
without Docker would hide that the images were never built.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from container_engine import DockerEngine, Missing, WheelIndex, build, image_requirements, standin_base

BASE_TAG = "flashdraft-base:containers-test"


def _fail(exc: Exception) -> None:
    pytest.fail(str(exc).splitlines()[0] if isinstance(exc, Missing) else str(exc), pytrace=False)


@pytest.fixture(scope="session")
def engine():
    try:
        with DockerEngine.start() as started:
            yield started
    except Missing as exc:
        _fail(exc)


@pytest.fixture(scope="session")
def wheel_index():
    index = WheelIndex(sys.executable, *image_requirements())
    try:
        url = index.start()
    except (Missing, subprocess.CalledProcessError) as exc:
        index.stop()
        _fail(Missing(f"the wheel index could not be made: {getattr(exc, 'stderr', '') or exc}"))
    yield url, index.ca_pem
    index.stop()


@pytest.fixture(scope="session")
def standin(engine):
    try:
        return standin_base(engine)
    except (Missing, subprocess.CalledProcessError) as exc:
        _fail(Missing(f"the stand-in base could not be made: {getattr(exc, 'stderr', '') or exc}"))


@pytest.fixture(scope="session")
def host_commit() -> str:
    from flashdraft.run.provenance import git_commit

    return git_commit() or ""


@pytest.fixture(scope="session")
def proxy_args(wheel_index, host_commit) -> dict[str, str]:
    """The build args a user behind a TLS-inspecting proxy passes (docs/cluster.md), and the commit."""
    url, ca = wheel_index
    return {"PIP_INDEX_URL": url, "TORCH_INDEX_URL": url, "EXTRA_CA_CERTS": ca, "FLASHDRAFT_COMMIT": host_commit}


@pytest.fixture(scope="session")
def base_image(engine, standin, proxy_args) -> str:
    """docker/base/Dockerfile built as is: only build args differ from a registry build."""
    seconds = build(engine, "docker/base/Dockerfile", BASE_TAG, {"PYTHON_IMAGE": standin, **proxy_args})
    size = engine.image_size(BASE_TAG)
    print(f"\nbuilt {BASE_TAG} in {seconds:.0f} s, {size / 1e9:.2f} GB", flush=True)
    return BASE_TAG


@pytest.fixture()
def docker_env(engine, monkeypatch):
    """This test's process talks to the tier's engine (docker-py and the docker CLI read DOCKER_HOST)."""
    monkeypatch.setenv("DOCKER_HOST", engine.host)
    return engine

