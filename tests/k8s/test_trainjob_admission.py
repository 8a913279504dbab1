"""The multi-node launcher (pipelines/trainjob.py) against the real API server and the Kubeflow Trainer CRD.

The TrainJob is rendered from the multi-node qwen3.6-27b pipeline's own launcher arguments (read from the compiled
spec) and created through the real CRD with strict field validation. No Trainer controller runs here: where a test
needs the TrainJob's node pod or its final status, it creates or patches them itself, standing in for the
controller, and says so. The scheduler that places that pod is the real one.
"""

from __future__ import annotations

import copy
import json
import threading
import time

import pytest
from fake_nodes import POOL_NODES
from support.kfp_pods import create_pod, wait_scheduled

from flashdraft.pipelines.runtime import stage_config
from flashdraft.pipelines.trainjob import (
    API_GROUP,
    API_VERSION,
    FINGERPRINT_KEY,
    JOBSET_NAME_LABEL,
    NODE_JOB,
    PLURAL,
    TrainJobError,
    create_trainjob,
    launch_and_wait,
    render_trainjob,
    trainjob_state,
)

pytestmark = pytest.mark.k8s

LAUNCHER = "exec-train-multinode"
FINGERPRINT = "0123456789abcdef"
ARGS = ("image", "node_selector", "tolerations", "gpus_per_node", "s3_secret_name", "tracking_secret_name",
        "hub_secret_name", "runtime_ref")


@pytest.fixture()
def launcher_args(compiled_pipelines, trainjob_crd, k8s, monkeypatch):
    """The launcher task's arguments as the compiled multi-node pipeline passes them by default, and a process
    environment that points the kubernetes client at this cluster (as a developer's KUBECONFIG would)."""
    _, pipeline = compiled_pipelines["multinode"]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(k8s.kubeconfig))
    cfg = stage_config(pipeline.task_input(LAUNCHER, "config_yaml"), pipeline.task_input(LAUNCHER, "overrides"))
    assert cfg.training.num_nodes == 4
    args = {arg: pipeline.task_input(LAUNCHER, arg) for arg in ARGS}
    args["gpus_per_node"] = int(args["gpus_per_node"])  # as the component body does (KFP hands ints over as floats)
    args["fingerprint"] = FINGERPRINT  # the body computes the train task's (pipelines/runtime.py trainjob_task)
    return cfg, args


class LaunchInThread:
    """launch_and_wait in a thread (it blocks until the TrainJob ends); result or exception afterwards."""

    def __init__(self, **kwargs):
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, kwargs=kwargs, daemon=True)
        self.thread.start()

    def _run(self, **kwargs):
        try:
            self.result = launch_and_wait(**kwargs)
        except Exception as exc:  # noqa: BLE001 (handed to the test)
            self.error = exc

    def join(self, timeout_s: float = 30) -> None:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "launch_and_wait did not return"


def _wait_trainjob(k8s, namespace: str, launch: LaunchInThread, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if launch.error:
            raise launch.error
        proc = k8s.kubectl("get", "trainjobs", "-n", namespace, "-o", "json")
        items = json.loads(proc.stdout)["items"]
        if items:
            return items[0]
        time.sleep(0.2)
    raise TimeoutError(f"no TrainJob in {namespace} after {timeout_s} s")


def _node_pod_spec(trainjob: dict) -> dict:
    """What Trainer's torch runtime would run on one node: the runtime patch's pod spec with the trainer's image,
    command and per-node resources (standing in for the Trainer controller, which does not run here)."""
    spec = trainjob["spec"]
    (job,) = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == NODE_JOB
    pod = copy.deepcopy(job["template"]["spec"]["template"]["spec"])
    (container,) = pod["containers"]
    resources = spec["trainer"]["resourcesPerNode"]
    container.update(image=spec["trainer"]["image"], command=spec["trainer"]["command"],
                     resources={"requests": resources["requests"],
                                "limits": {k: str(v) for k, v in resources.get("limits", {}).items()}})
    pod["restartPolicy"] = "Never"
    return pod


def _complete(k8s, trainjob: dict, condition: str = "Complete", message: str = "all nodes done") -> None:
    """Mark the TrainJob Complete (or Failed), as Trainer's controller would when its JobSet ends."""
    meta = trainjob["metadata"]
    k8s.kubectl("patch", "trainjob", meta["name"], "-n", meta["namespace"], "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"conditions": [{
                    "type": condition, "status": "True", "reason": f"JobSet{condition}", "message": message,
                    "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]}}))


def test_launcher_trainjob_is_admitted_placed_on_b200_and_followed_to_completion(k8s, kube_api, namespace,
                                                                                 launcher_args):
    from kubernetes import client

    cfg, args = launcher_args
    launch = LaunchInThread(cfg=cfg, config_yaml="", overrides={}, namespace=namespace, poll_s=0.2, **args)
    stored = _wait_trainjob(k8s, namespace, launch)
    rendered = render_trainjob(cfg, namespace=namespace, **args)
    assert stored["metadata"]["annotations"][FINGERPRINT_KEY] == args["fingerprint"]
    # Admitted as rendered: nothing pruned by the CRD's structural schema (strict field validation refuses
    # unknown fields instead of dropping them), so the placement patch reached the server intact.
    assert stored["spec"]["runtimePatches"] == rendered["spec"]["runtimePatches"]
    assert stored["spec"]["trainer"]["numNodes"] == 4 and stored["spec"]["trainer"]["numProcPerNode"] == 8
    # Stand in for the Trainer controller: one node pod, placed by the real scheduler.
    core = client.CoreV1Api(kube_api)
    create_pod(core, namespace, "node-0", _node_pod_spec(stored), {JOBSET_NAME_LABEL: stored["metadata"]["name"]})
    placed = wait_scheduled(core, namespace, "node-0")
    assert placed.node in POOL_NODES["trainer"], placed
    # ... and its final status.
    _complete(k8s, stored)
    launch.join()
    assert launch.error is None, launch.error
    assert launch.result["state"] == "Complete" and launch.result["trainjob"] == stored["metadata"]["name"]


@pytest.mark.parametrize(("change", "reason"), [
    ({"gpus_per_node": 16}, "Insufficient nvidia.com/gpu"),
    ({"node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
     "didn't match Pod's node affinity/selector"),
], ids=["more-gpus-than-a-node", "label-no-node-carries"])
def test_launcher_surfaces_the_schedulers_reason_and_gives_up(k8s, kube_api, namespace, launcher_args, change,
                                                              reason, caplog):
    from kubernetes import client

    cfg, args = launcher_args
    launch = LaunchInThread(cfg=cfg, config_yaml="", overrides={}, namespace=namespace, poll_s=0.2,
                            unschedulable_timeout_s=1.0, **{**args, **change})
    stored = _wait_trainjob(k8s, namespace, launch)
    core = client.CoreV1Api(kube_api)
    create_pod(core, namespace, "node-0", _node_pod_spec(stored), {JOBSET_NAME_LABEL: stored["metadata"]["name"]})
    launch.join()
    assert isinstance(launch.error, TrainJobError), launch.error
    message = str(launch.error)
    assert reason in message and "node-0" in message and "trainer_node_selector" in message, message
    assert any(reason in r.getMessage() for r in caplog.records if r.levelname == "WARNING"), "not logged while waiting"
    gone = k8s.kubectl("get", "trainjob", stored["metadata"]["name"], "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, "the launcher deletes the TrainJob it gives up on"


def _rendered(cfg, args, namespace):
    return render_trainjob(cfg, namespace=namespace, **args)


@pytest.mark.parametrize(("breakage", "server_says"), [
    # A field of an older Trainer (2.1): refused, not silently pruned, thanks to strict field validation.
    (lambda b: b["spec"].update(podTemplateOverrides=[{"targetJobs": [{"name": "node"}]}]),
     'unknown field "spec.podTemplateOverrides"'),
    (lambda b: b["spec"]["trainer"].update(numProcPerNode=0), "spec.trainer.numProcPerNode"),
    (lambda b: b["metadata"].update(name="Bad_Name"), "metadata.name"),
], ids=["stale-field", "zero-procs", "invalid-name"])
def test_a_wrong_manifest_is_refused_and_the_message_is_readable(kube_api, namespace, launcher_args, breakage,
                                                                 server_says):
    from kubernetes import client

    cfg, args = launcher_args
    body = _rendered(cfg, args, namespace)
    breakage(body)
    with pytest.raises(TrainJobError) as refused:
        create_trainjob(client.CustomObjectsApi(kube_api), body)
    message = str(refused.value)
    assert f"the API server refused TrainJob {namespace}/" in message and server_says in message, message
    assert "HTTP response headers" not in message and "Trainer >= 2.2" in message, message


def test_a_serviceaccount_without_trainjob_rights_gets_the_chart_setting_to_fix(k8s, namespace, launcher_args):
    from kubernetes import client

    cfg, args = launcher_args
    token = k8s.kubectl("create", "token", "default", "-n", namespace).stdout.strip()
    conf = client.Configuration()
    conf.host = json.loads(k8s.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    conf.ssl_ca_cert = str(k8s.dir / "certs" / "apiserver.crt")
    conf.api_key = {"authorization": f"Bearer {token}"}
    api = client.CustomObjectsApi(client.ApiClient(conf))
    with pytest.raises(TrainJobError) as refused:
        create_trainjob(api, _rendered(cfg, args, namespace))
    message = str(refused.value)
    assert "403 Forbidden" in message and f"system:serviceaccount:{namespace}:default" in message, message
    assert "multiNode.enabled=true" in message, message


def test_an_existing_trainjob_is_adopted_not_duplicated(kube_api, namespace, launcher_args):
    from kubernetes import client

    cfg, args = launcher_args
    api = client.CustomObjectsApi(kube_api)
    body = _rendered(cfg, args, namespace)
    assert create_trainjob(api, body) is True
    assert create_trainjob(api, body) is False  # a retried launcher pod finds its job
    items = api.list_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL)["items"]
    assert len(items) == 1


def test_the_charts_serviceaccount_can_run_the_launcher(k8s, kube_api, chart, launcher_args, tmp_path, monkeypatch):
    """The release's ServiceAccount (multi-node on) is enough for every call the launcher makes: create, get and
    delete the TrainJob, list its pods. The launcher runs with that account's token, not as admin."""
    from kubernetes import client

    ns, tj_ns = "fd-launcher", "fd-launcher-training"
    k8s.helm("install", "flashdraft", str(chart), "-n", ns, "--create-namespace", "--no-hooks",
             "--set", "multiNode.enabled=true", "--set", f"multiNode.trainJobNamespace={tj_ns}")
    try:
        token = k8s.kubectl("create", "token", "flashdraft", "-n", ns).stdout.strip()
        monkeypatch.setenv("KUBECONFIG", str(k8s.kubeconfig_for(tmp_path / "sa-kubeconfig", token)))
        cfg, args = launcher_args
        launch = LaunchInThread(cfg=cfg, config_yaml="", overrides={}, namespace=tj_ns, poll_s=0.2, **args)
        stored = _wait_trainjob(k8s, tj_ns, launch)
        core = client.CoreV1Api(kube_api)
        create_pod(core, tj_ns, "node-0", _node_pod_spec(stored), {JOBSET_NAME_LABEL: stored["metadata"]["name"]})
        assert wait_scheduled(core, tj_ns, "node-0").node in POOL_NODES["trainer"]
        _complete(k8s, stored)
        launch.join()
        assert launch.error is None, launch.error
        assert launch.result["state"] == "Complete"
    finally:
        k8s.helm("uninstall", "flashdraft", "-n", ns, check=False)
        k8s.kubectl("delete", "pods,trainjobs", "--all", "-n", tj_ns, "--force", "--grace-period=0", check=False)


def _wait_replaced(k8s, namespace: str, launch: LaunchInThread, old_uid: str, timeout_s: float = 60) -> dict:
    """The TrainJob once the launcher has replaced the one of uid `old_uid` (deleted it, waited, created anew)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = _wait_trainjob(k8s, namespace, launch)
        if job["metadata"]["uid"] != old_uid:
            return job
        time.sleep(0.2)
    raise TimeoutError(f"the TrainJob of uid {old_uid} was not replaced after {timeout_s} s")


@pytest.mark.parametrize(("fingerprint", "condition", "message"), [
    ("fedcba9876543210", "Complete", "all nodes done"),  # training.max_steps raised since: must train again
    (FINGERPRINT, "Failed", "node-0 OOMKilled"),  # the same task failed: a retry must not fail at once
], ids=["complete-other-fingerprint", "failed-same-fingerprint"])
def test_a_finished_or_foreign_trainjob_is_replaced_and_the_new_one_followed(k8s, kube_api, namespace, launcher_args,
                                                                            fingerprint, condition, message):
    from kubernetes import client

    cfg, args = launcher_args
    api = client.CustomObjectsApi(kube_api)
    assert create_trainjob(api, _rendered(cfg, {**args, "fingerprint": fingerprint}, namespace)) is True
    old = api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, render_trainjob(
        cfg, namespace=namespace, **args)["metadata"]["name"])
    _complete(k8s, old, condition, message)
    launch = LaunchInThread(cfg=cfg, config_yaml="", overrides={}, namespace=namespace, poll_s=0.2, **args)
    new = _wait_replaced(k8s, namespace, launch, old["metadata"]["uid"])
    assert new["metadata"]["annotations"][FINGERPRINT_KEY] == FINGERPRINT
    assert trainjob_state(new)[0] == "Running", "the launcher waits on the new job, not the old outcome"
    assert launch.thread.is_alive() and launch.error is None, launch.error
    _complete(k8s, new)
    launch.join()
    assert launch.error is None, launch.error
    assert launch.result["state"] == "Complete"
    items = api.list_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL)["items"]
    assert [i["metadata"]["uid"] for i in items] == [new["metadata"]["uid"]]


def test_a_running_trainjob_of_the_same_fingerprint_is_adopted(k8s, kube_api, namespace, launcher_args):
    from kubernetes import client

    cfg, args = launcher_args
    api = client.CustomObjectsApi(kube_api)
    assert create_trainjob(api, _rendered(cfg, args, namespace)) is True
    name = _rendered(cfg, args, namespace)["metadata"]["name"]
    uid = api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)["metadata"]["uid"]
    launch = LaunchInThread(cfg=cfg, config_yaml="", overrides={}, namespace=namespace, poll_s=0.2, **args)
    time.sleep(1.0)
    stored = api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    assert stored["metadata"]["uid"] == uid, "a running job of this task is adopted, not replaced"
    _complete(k8s, stored)
    launch.join()
    assert launch.error is None and launch.result["trainjob"] == name, launch.error


def test_runs_a_b_and_a_dash_b_get_distinct_trainjobs(kube_api, namespace, launcher_args):
    from kubernetes import client

    cfg, args = launcher_args
    api = client.CustomObjectsApi(kube_api)
    for run_id in ("a_b", "a-b"):
        assert create_trainjob(api, _rendered(cfg.with_overrides({"run_id": run_id}), args, namespace)) is True
    items = api.list_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL)["items"]
    assert sorted(i["metadata"]["labels"]["flashdraft.io/run-id"] for i in items) == ["a-b", "a_b"]
    assert len({i["metadata"]["name"] for i in items}) == 2
