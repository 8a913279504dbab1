"""`run-local --runner docker`: the same DAG in the images a cluster pulls, under kfp.local's DockerRunner.

The way to test images before `make push`: each task runs in its pool's image (or one `--image` for every pool)
on this machine's Docker engine. Decisions, so that a run in containers commits what a run in-process commits:
- Containers run as the invoking user (uid:gid), so what they write into the work folder and a file:// store is
  the user's, as in-process; the images' /cache and /work are writable by any uid.
- The host's network: a local S3 endpoint on 127.0.0.1 is reachable as in-process.
- kfp.local mounts only its pipeline root; a file:// store elsewhere is bind-mounted at the same path.
- Before anything runs, the engine, every image and each image's flashdraft version are checked, and a problem is
  one line (`ContainerError`): a DAG half-run in stale images would commit results a new image refuses to reuse.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashdraft.config import RunConfig

# What a task's container gets from this process's environment besides the console's settings: the S3 credentials
# and endpoint, the Hub's token and mirror (never in the image; on a cluster they come from the Secrets).
PASSED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION",
              "AWS_ENDPOINT_URL", "HF_HUB_OFFLINE", "HF_TOKEN", "HF_ENDPOINT")


class ContainerError(RuntimeError):
    """A container run cannot start: no engine, a missing image, an image of another flashdraft version."""


def _client() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - docker-py raises DockerException or a requests error, by case
        where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        raise ContainerError(f"no Docker daemon at {where} ({type(exc).__name__}): start dockerd or set "
                             "DOCKER_HOST") from None
    return client


def _version_of(line: str) -> tuple[str, str | None]:
    """(`0.1.0`, commit or None) from `flashdraft 0.1.0 (commit abc...)` / `(commit unknown)`."""
    words = line.replace("(", " ").replace(")", " ").split()
    version = words[1] if len(words) > 1 else line.strip()
    commit = words[words.index("commit") + 1] if "commit" in words[:-1] else None
    return version, None if commit == "unknown" else commit


def versions_match(host: str, image: str) -> bool:
    """Same version, and the same commit where both know theirs (an image built without FLASHDRAFT_COMMIT
    cannot say; a checkout with uncommitted changes still matches an image of its HEAD)."""
    (hv, hc), (iv, ic) = _version_of(host), _version_of(image)
    if hc is None or ic is None:
        return hv == iv
    return hv == iv and hc.removesuffix("+dirty") == ic.removesuffix("+dirty")


@dataclass(frozen=True)
class ContainerRun:
    """Which image runs each pool's tasks (pool -> image)."""

    images: dict[str, str]

    @classmethod
    def resolve(cls, image: str | None = None, registry: str | None = None, tag: str | None = None) -> ContainerRun:
        """One image for every pool, else the per-pool images of `registry`/`tag` (as `compile` names them)."""
        from flashdraft.pipelines.pipeline import POOL_IMAGE, stage_images

        if image:
            return cls({pool: image for pool in POOL_IMAGE})
        return cls(stage_images(registry, tag))

    def preflight(self) -> str:
        """Check the engine, the images and their flashdraft version; returns the version line they share."""
        import docker

        from flashdraft.cli.main import version_line

        client = _client()
        host = version_line()
        try:
            for image in sorted(set(self.images.values())):
                try:
                    client.images.get(image)
                except docker.errors.ImageNotFound:
                    raise ContainerError(f"image {image} not found on this Docker engine: build it (`make images`) "
                                         f"or pull it") from None
                out = client.containers.run(image, ["--version"], remove=True, network_mode="none")
                line = out.decode().strip().splitlines()[-1] if out else ""
                if not versions_match(host, line):
                    raise ContainerError(f"image {image} has {line or 'no flashdraft'}, this machine {host}: "
                                         "rebuild the image (`make images`) or run this checkout's version")
        finally:
            client.close()
        return host

    def kfp_runner(self, cfg: RunConfig, workdir: Path, env: dict[str, str]) -> Any:
        """kfp.local's DockerRunner with this module's decisions (user, network, store mount, environment: `env`
        plus PASSED_ENV from this process)."""
        import docker
        from kfp import local

        mounts = []
        root = cfg.storage.root
        if root.startswith("file://"):
            store = Path(root.removeprefix("file://"))
            store.mkdir(parents=True, exist_ok=True)
            if not store.is_relative_to(workdir):
                mounts.append(docker.types.Mount(target=str(store), source=str(store), type="bind"))
        passed = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        return local.DockerRunner(user=f"{os.getuid()}:{os.getgid()}", network_mode="host",
                                  environment={**passed, **env}, mounts=mounts)
