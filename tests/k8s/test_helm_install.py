"""`helm install` of the chart into the real API server, with each ci/ values file: every object admitted, the
upload hook Job created as specified, RBAC checked with `kubectl auth can-i` (allowed and denied), upgrade,
uninstall, and a hook that cannot finish failing the install readably in bounded time.

No kubelet runs here. `KubeletStandIn` does the two things a kubelet would that the tests need: it runs a bound
hook pod to success (the upload itself needs a KFP API, which cannot run here), and it confirms graceful pod
deletions. Everything else (admission, defaulting, RBAC, the Job controller, the scheduler) is the real thing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
CI_VALUES = sorted((ROOT / "helm" / "flashdraft" / "ci").glob("*.yaml"))
RELEASE = "flashdraft"  # the chart's fullname is then "flashdraft" too
HELM_DEFAULT_TIMEOUT_S = 300


class KubeletStandIn:
    """While active, for one namespace: records every Job and where its pods were bound; runs bound pods to
    success (when `succeed`); confirms graceful deletions. Polls the API every 0.2 s in a thread."""

    def __init__(self, kube_api, namespace: str, succeed: bool = True):
        from kubernetes import client

        self.core, self.batch, self.api = client.CoreV1Api(kube_api), client.BatchV1Api(kube_api), kube_api
        self.namespace, self.succeed = namespace, succeed
        self.jobs: dict[str, dict] = {}
        self.pod_nodes: dict[str, str | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: Exception | None = None

    def __enter__(self) -> KubeletStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 (namespace may not exist yet; keep the last error for asserts)
                self.error = exc
            time.sleep(0.2)

    def _tick(self) -> None:
        ns = self.namespace
        for job in self.batch.list_namespaced_job(ns).items:
            self.jobs[job.metadata.name] = self.api.sanitize_for_serialization(job)
        for pod in self.core.list_namespaced_pod(ns).items:
            name = pod.metadata.name
            self.pod_nodes[name] = pod.spec.node_name
            if pod.metadata.deletion_timestamp:
                self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            elif self.succeed and pod.spec.node_name and pod.status.phase == "Pending":
                container = pod.spec.containers[0].name
                self.core.patch_namespaced_pod_status(name, ns, {"status": {
                    "phase": "Succeeded",
                    "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
                    "containerStatuses": [{"name": container, "image": pod.spec.containers[0].image, "imageID": "",
                                           "ready": False, "restartCount": 0,
                                           "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}})


def helm(k8s, *args: str, check: bool = True):
    return k8s.helm(*args, check=check)


def can_i(k8s, subject: str, verb: str, resource: str, namespace: str | None) -> bool:
    """`kubectl auth can-i` as a ServiceAccount (`ns:name`), answered by the API server's RBAC authorizer."""
    ns_args = ["-n", namespace] if namespace else []
    proc = k8s.kubectl("auth", "can-i", verb, resource, *ns_args, "--as", f"system:serviceaccount:{subject}",
                       check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stdout + proc.stderr
    return answer == "yes"


def _values_id(p: Path | None) -> str:
    return p.stem if p else "default"


def _values(path: Path | None) -> dict:
    return yaml.safe_load(path.read_text()) if path else {}


class Installed:
    def __init__(self, values: Path | None, namespace: str, stand_in: KubeletStandIn, manifest: str):
        self.values, self.namespace, self.stand_in = values, namespace, stand_in
        self.docs = [d for d in yaml.safe_load_all(manifest) if d]
        cfg = _values(values)
        self.multinode = cfg.get("multiNode", {}).get("enabled", False)
        self.trainjob_ns = cfg.get("multiNode", {}).get("trainJobNamespace") or namespace
        self.s3_secret = cfg.get("s3", {}).get("existingSecret") or f"{RELEASE}-s3"
        self.tracking_secret = cfg.get("tracking", {}).get("existingSecret") or f"{RELEASE}-tracking"
        self.hub_secret = cfg.get("hub", {}).get("existingSecret") or f"{RELEASE}-hub"
        self.extra_subjects = [f"{s.get('namespace', namespace)}:{s['name']}"
                               for s in cfg.get("rbac", {}).get("extraSubjects", [])]


@pytest.fixture(scope="module", params=[None, *CI_VALUES], ids=_values_id)
def installed(request, k8s, kube_api, trainjob_crd, argo_task_results, chart):
    """The chart installed (hooks included) with one values file; uninstalled afterwards."""
    values = request.param
    namespace = f"fd-{_values_id(values)}"[:40]
    args = ["-f", str(values)] if values else []
    with KubeletStandIn(kube_api, namespace) as stand_in:
        helm(k8s, "install", RELEASE, str(chart), "-n", namespace, "--create-namespace", *args, "--timeout", "90s")
    manifest = helm(k8s, "get", "manifest", RELEASE, "-n", namespace).stdout
    yield Installed(values, namespace, stand_in, manifest)
    helm(k8s, "uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "60s", check=False)


def test_every_object_is_admitted(k8s, installed):
    kinds = {(d["kind"], d["metadata"]["name"]) for d in installed.docs}
    assert {("ServiceAccount", RELEASE), ("Role", f"{RELEASE}-pipeline"), ("ConfigMap", f"{RELEASE}-defaults"),
            ("ConfigMap", f"{RELEASE}-pipeline")} <= kinds
    for doc in installed.docs:
        ns = doc["metadata"].get("namespace") or (None if doc["kind"] == "Namespace" else installed.namespace)
        live = k8s.get(doc["kind"], doc["metadata"]["name"], *(["-n", ns] if ns else []))
        assert live["metadata"]["uid"], doc["kind"]
    if installed.multinode:
        assert ("Namespace", installed.trainjob_ns) in kinds, "the chart creates the TrainJob namespace"


def test_upload_hook_job_was_created_with_the_right_spec(installed):
    job = installed.stand_in.jobs.get(f"{RELEASE}-upload-pipeline")
    assert job, f"no upload Job seen; stand-in error: {installed.stand_in.error}"
    assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"post-install", "post-upgrade"}
    spec = job["spec"]
    assert 0 < spec["activeDeadlineSeconds"] < HELM_DEFAULT_TIMEOUT_S, "a stuck hook must fail before helm times out"
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    values = _values(installed.values)  # the version: pipeline.version, else the image tag, else appVersion
    version = values.get("pipeline", {}).get("version") or values.get("images", {}).get("tag") or "0.1.0"
    assert [*container["command"], *container["args"]] == [
        "flashdraft", "upload-pipeline", "--package", "/pipeline/pipeline.yaml", "--name", "flashdraft",
        "--version", version]
    assert pod["serviceAccountName"] == f"{RELEASE}-uploader" and pod["automountServiceAccountToken"] is False
    volume = next(v for v in pod["volumes"] if v["name"] == "pipeline")
    assert volume["configMap"]["name"] == f"{RELEASE}-pipeline"
    token = next(v for v in pod["volumes"] if v["name"] == "kfp-token")
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "pipelines.kubeflow.org"
    # The scheduler put the hook pod on the CPU node (the chart places it with pools.cpu), never on a GPU node.
    nodes = {n for name, n in installed.stand_in.pod_nodes.items() if name.startswith(f"{RELEASE}-upload-pipeline")}
    assert nodes == {"cpu-0"}, nodes


# What a pipeline pod needs from the API (KFP launcher, Argo executor, stage pods) and what it must not get.
NEEDED = [("get", "pods"), ("watch", "pods"), ("create", "workflowtaskresults.argoproj.io"),
          ("patch", "workflowtaskresults.argoproj.io"), ("get", "configmaps/kfp-launcher"),
          ("get", f"configmaps/{RELEASE}-defaults")]
NOT_NEEDED = [("list", "secrets"), ("get", "secrets/some-other-secret"), ("get", f"configmaps/{RELEASE}-pipeline"),
              ("update", f"configmaps/{RELEASE}-defaults"), ("create", "pods"), ("delete", "pods"),
              ("create", "deployments.apps"), ("create", "rolebindings.rbac.authorization.k8s.io")]
TRAINJOB_NEEDED = [("create", "trainjobs.trainer.kubeflow.org"), ("get", "trainjobs.trainer.kubeflow.org"),
                   ("list", "trainjobs.trainer.kubeflow.org"), ("watch", "trainjobs.trainer.kubeflow.org"),
                   ("delete", "trainjobs.trainer.kubeflow.org"), ("list", "pods")]
TRAINJOB_NOT_NEEDED = [("update", "trainjobs.trainer.kubeflow.org"), ("patch", "trainjobs.trainer.kubeflow.org"),
                       ("create", "pods"), ("get", "secrets/some-other-secret")]


def _check(k8s, subject, rules, namespace, expected):
    wrong = [(verb, res, namespace) for verb, res in rules if can_i(k8s, subject, verb, res, namespace) != expected]
    assert not wrong, f"{subject} {'cannot' if expected else 'can'}: {wrong}"


def test_rbac_grants_what_the_pipeline_needs_and_nothing_more(k8s, installed):
    ns, sa = installed.namespace, f"{installed.namespace}:{RELEASE}"
    for subject in [sa, *installed.extra_subjects]:
        _check(k8s, subject, [*NEEDED, ("get", f"secrets/{installed.s3_secret}")], ns, True)
        # the tracking and Hub Secrets reach pods through the kubelet (env), never through the API
        _check(k8s, subject, [*NOT_NEEDED, ("get", f"secrets/{installed.tracking_secret}"),
                              ("get", f"secrets/{installed.hub_secret}")], ns, False)
        assert not can_i(k8s, subject, "list", "nodes", None)
    if installed.multinode:
        _check(k8s, sa, TRAINJOB_NEEDED, installed.trainjob_ns, True)
        _check(k8s, sa, TRAINJOB_NOT_NEEDED, installed.trainjob_ns, False)
        if installed.trainjob_ns != ns:
            assert not can_i(k8s, sa, "create", "trainjobs.trainer.kubeflow.org", ns)
    else:
        _check(k8s, sa, [("create", "trainjobs.trainer.kubeflow.org"), ("list", "trainjobs.trainer.kubeflow.org")],
               ns, False)
    # The upload hook's identity has no Kubernetes API rights at all.
    uploader = f"{ns}:{RELEASE}-uploader"
    _check(k8s, uploader, [("get", f"configmaps/{RELEASE}-pipeline"), ("get", "pods"),
                           ("get", f"secrets/{installed.s3_secret}")], ns, False)


def test_upgrade_to_multinode_then_uninstall_and_reinstall(k8s, kube_api, trainjob_crd, chart):
    ns, tj_ns = "fd-upgrade", "fd-upgrade-training"
    sa = f"{ns}:{RELEASE}"
    with KubeletStandIn(kube_api, ns):
        helm(k8s, "install", RELEASE, str(chart), "-n", ns, "--create-namespace", "--timeout", "90s")
        assert not can_i(k8s, sa, "create", "trainjobs.trainer.kubeflow.org", tj_ns)
        helm(k8s, "upgrade", RELEASE, str(chart), "-n", ns, "--set", "multiNode.enabled=true",
             "--set", f"multiNode.trainJobNamespace={tj_ns}", "--timeout", "90s")
        assert can_i(k8s, sa, "create", "trainjobs.trainer.kubeflow.org", tj_ns)
        assert helm(k8s, "history", RELEASE, "-n", ns, "-o", "json").stdout.count('"deployed"') == 1
        helm(k8s, "uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "60s")
        for kind in ("role", "rolebinding", "serviceaccount", "configmap", "secret"):
            left = k8s.kubectl("get", kind, "-n", ns, "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name")
            assert left.stdout.strip() == "", f"uninstall left {left.stdout}"
        assert k8s.kubectl("get", "role", f"{RELEASE}-trainjobs", "-n", tj_ns, check=False).returncode != 0
        # The TrainJob namespace is kept (it may hold running TrainJobs) and a reinstall adopts it.
        assert k8s.get("namespace", tj_ns)["status"]["phase"] == "Active"
        helm(k8s, "install", RELEASE, str(chart), "-n", ns, "--set", "multiNode.enabled=true",
             "--set", f"multiNode.trainJobNamespace={tj_ns}", "--timeout", "90s")
        assert can_i(k8s, sa, "create", "trainjobs.trainer.kubeflow.org", tj_ns)
        helm(k8s, "uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "60s")


def test_missing_trainjob_namespace_is_named_when_the_chart_may_not_create_it(k8s, chart):
    proc = helm(k8s, "install", RELEASE, str(chart), "-n", "fd-nocreate", "--create-namespace", "--no-hooks",
                "--set", "multiNode.enabled=true", "--set", "multiNode.trainJobNamespace=fd-absent-training",
                "--set", "multiNode.createNamespace=false", check=False)
    assert proc.returncode != 0
    assert 'namespaces "fd-absent-training" not found' in proc.stderr, proc.stderr
    helm(k8s, "uninstall", RELEASE, "-n", "fd-nocreate", check=False)


def test_a_hook_that_cannot_finish_fails_the_install_readably_in_bounded_time(k8s, kube_api, chart):
    """The upload Job's pod never completes (as with an unreachable KFP or an unpullable image): the Job's own
    deadline fails it and helm reports which hook failed, long before its own timeout."""
    ns = "fd-stuck-hook"
    start = time.monotonic()
    with KubeletStandIn(kube_api, ns, succeed=False):
        proc = helm(k8s, "install", RELEASE, str(chart), "-n", ns, "--create-namespace",
                    "--set", "pipeline.upload.activeDeadlineSeconds=3", "--timeout", "120s", check=False)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    message = proc.stderr
    assert "failed post-install" in message and f"Job/{ns}/{RELEASE}-upload-pipeline" in message, message
    assert "Failed" in message and "context deadline exceeded" not in message, message
    assert elapsed < 60, f"took {elapsed:.0f} s"
    # The failed Job stays for `kubectl logs`/`describe`, with the reason.
    conditions = k8s.get("job", f"{RELEASE}-upload-pipeline", "-n", ns)["status"]["conditions"]
    assert any(c["type"] == "Failed" and c["reason"] == "DeadlineExceeded" for c in conditions), conditions
    helm(k8s, "uninstall", RELEASE, "-n", ns, "--no-hooks", check=False)
