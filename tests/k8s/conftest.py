"""Fixtures of the `k8s` tier: one real control plane per session (see k8s_cluster.py), with fake nodes shaped
like the two GPU pools of the `qwen3.6-27b` preset plus a CPU node, and the Kubeflow Trainer TrainJob CRD."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from fake_nodes import FAKE_NODES
from k8s_cluster import INSTALL_HINT, ControlPlane, MissingBinary, asset_dirs, find_binaries

ROOT = Path(__file__).resolve().parents[2]
TRAINJOB_CRD = "trainer.kubeflow.org_trainjobs.yaml"


def _node(name: str, spec: dict) -> dict:
    capacity = {"cpu": spec["cpu"], "memory": spec["memory"], "pods": "110", "ephemeral-storage": "1Ti"}
    if spec["gpus"]:
        capacity["nvidia.com/gpu"] = str(spec["gpus"])
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              **spec["labels"]}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": spec["taints"]},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "FakeNode",
                                       "message": "a Node object without a kubelet (k8s test tier)"}]}}


def _asset_file(name: str) -> Path | None:
    """`name` from the provided folders, else from ../shared/k8s beside the clone (which ships the CRD, not the
    binaries)."""
    return next((d / name for d in [*asset_dirs(), ROOT.parent / "shared" / "k8s"] if (d / name).is_file()), None)


NO_CONTROL_PLANE = f"no control plane provided: {INSTALL_HINT}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Every test skipped for want of a control plane is reported at this file, so `-ra` folds them into one line
    (pytest would otherwise print one line per test, at each test's own location)."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and report.longrepr[2].endswith(NO_CONTROL_PLANE):
        report.longrepr = (__file__, None, report.longrepr[2])
    return report


@pytest.fixture(scope="session")
def k8s(tmp_path_factory) -> ControlPlane:
    """The control plane with the fake nodes; stopped at session end whatever happened (and, through
    PR_SET_PDEATHSIG, even if the test process is killed)."""
    if not asset_dirs():
        pytest.skip(NO_CONTROL_PLANE)
    try:
        bins = find_binaries()
    except MissingBinary as exc:  # a folder was named: the user wants the tier, so a missing binary is an error
        pytest.fail(str(exc))
    cluster = ControlPlane(bins, tmp_path_factory.mktemp("k8s"))
    try:
        cluster.start()
        cluster.kubectl("create", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [_node(n, s) for n, s in FAKE_NODES.items()]}))
        # Admission marks new nodes not-ready; with no node-lifecycle controller nothing would clear it.
        cluster.kubectl("taint", "nodes", "--all", "node.kubernetes.io/not-ready:NoSchedule-")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def trainjob_crd(k8s) -> str:
    """The Kubeflow Trainer TrainJob CRD (found beside the binaries), installed and established."""
    crd = _asset_file(TRAINJOB_CRD)
    if crd is None:
        pytest.fail(f"{TRAINJOB_CRD} (the Kubeflow Trainer CRD) is neither in FLASHDRAFT_K8S_BIN/KUBEBUILDER_ASSETS "
                    "nor in ../shared/k8s beside the clone")
    k8s.kubectl("apply", "--server-side", "-f", str(crd))
    deadline = time.monotonic() + 60
    while True:  # `kubectl wait` can error instead of waiting right after creation: poll the condition instead
        conds = (k8s.get("crd", "trainjobs.trainer.kubeflow.org").get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
            return "trainjobs.trainer.kubeflow.org"
        if time.monotonic() > deadline:
            pytest.fail(f"TrainJob CRD not established after 60 s: {conds}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def argo_task_results(k8s) -> str:
    """A stand-in for Argo's WorkflowTaskResult CRD (KFP installs the real one), without a schema: `kubectl auth
    can-i` resolves a resource's API group through discovery, so the resource must exist for the RBAC checks."""
    k8s.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "workflowtaskresults.argoproj.io"},
        "spec": {"group": "argoproj.io", "scope": "Namespaced",
                 "names": {"kind": "WorkflowTaskResult", "plural": "workflowtaskresults",
                           "singular": "workflowtaskresult", "listKind": "WorkflowTaskResultList"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]}}))
    deadline = time.monotonic() + 30
    while "workflowtaskresults" not in k8s.kubectl("api-resources", "--api-group=argoproj.io", "-o", "name",
                                                   check=False).stdout:
        if time.monotonic() > deadline:
            pytest.fail("the workflowtaskresults.argoproj.io stand-in CRD is not served after 30 s")
        time.sleep(0.3)
    return "workflowtaskresults.argoproj.io"


@pytest.fixture(scope="session")
def kube_api(k8s):
    """A kubernetes Python client (the one flashdraft's launcher uses) for this cluster."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(k8s.kubeconfig))


@pytest.fixture()
def namespace(k8s, request) -> str:
    """A fresh namespace for one test (with its `default` ServiceAccount, which pod admission needs)."""
    name = f"t-{request.node.name.lower()}"[:50].replace("_", "-").replace("[", "-").replace("]", "").rstrip("-")
    name = f"{name}-{int(time.time() * 1000) % 100000}"
    k8s.kubectl("create", "namespace", name)
    deadline = time.monotonic() + 30
    while k8s.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        if time.monotonic() > deadline:
            pytest.fail(f"no default ServiceAccount in {name} after 30 s:\n{k8s.log_tail('kube-controller-manager')}")
        time.sleep(0.2)
    yield name
    # No kubelet confirms a graceful deletion, so bound pods would hold their node's GPUs forever: force them.
    k8s.kubectl("delete", "pods", "--all", "-n", name, "--force", "--grace-period=0", check=False)
    k8s.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def chart(tmp_path_factory, compiled_pipelines) -> Path:
    """A scratch copy of the chart with the real compiled qwen3.6-27b pipeline in files/pipeline.yaml (what `make
    chart-pipeline` does), so the upload ConfigMap the server admits is full size."""
    chart = tmp_path_factory.mktemp("chart") / "flashdraft"
    shutil.copytree(ROOT / "helm" / "flashdraft", chart, ignore=shutil.ignore_patterns("pipeline.yaml"))
    (chart / "files" / "pipeline.yaml").write_text(compiled_pipelines["offline"][0])
    return chart


# The qwen3.6-27b preset's DAG shapes: single-node offline, streaming (adds stream-end), multi-node (the TrainJob
# launcher replaces the train pod).
PIPELINE_VARIANTS = {"offline": {}, "streaming": {"mode.kind": "streaming"}, "multinode": {"training.num_nodes": 4}}


@pytest.fixture(scope="session")
def compiled_pipelines(tmp_path_factory) -> dict:
    """variant -> (yaml text, CompiledPipeline) of the qwen3.6-27b preset, compiled as `make compile` does."""
    import yaml
    from support.kfp_pods import CompiledPipeline

    from flashdraft.config import load_config
    from flashdraft.pipelines.pipeline import compile_pipeline

    out = tmp_path_factory.mktemp("compiled")
    compiled = {}
    for variant, overrides in PIPELINE_VARIANTS.items():
        path = out / f"{variant}.yaml"
        compile_pipeline(load_config(preset="qwen3.6-27b", overrides=overrides), str(path),
                         "registry.example.com/ml", "k8s-tier")
        text = path.read_text()
        compiled[variant] = (text, CompiledPipeline(*yaml.safe_load_all(text)))
    return compiled
