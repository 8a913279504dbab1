"""The multi-node TrainJob manifest (pinned Trainer API) and the plan gate's DAG-shape check."""

from __future__ import annotations

import re

import pytest
import yaml

from flashdraft.config import ConfigError, load_config
from flashdraft.pipelines.runtime import check_compiled_shape, stage_config
from flashdraft.pipelines.secret_env import HUB_SECRET_KEYS, TRACKING_SECRET_KEYS
from flashdraft.pipelines.trainjob import (
    FINGERPRINT_KEY,
    NAME_MAX_CHARS,
    TrainJobError,
    adoption,
    ensure_trainjob,
    render_trainjob,
    trainjob_name,
    trainjob_state,
)

# Field names of trainer.kubeflow.org/v1alpha1 as of Trainer 2.2+ (TrainJobSpec / Trainer).
SPEC_FIELDS = {"runtimeRef", "trainer", "runtimePatches", "initializer", "labels", "annotations", "suspend",
               "managedBy", "activeDeadlineSeconds"}
TRAINER_FIELDS = {"image", "command", "args", "env", "numNodes", "resourcesPerNode", "numProcPerNode"}
STALE_FIELDS = ("podSpecOverrides", "podTemplateOverrides")
FP, OTHER_FP = "0123456789abcdef", "fedcba9876543210"
# A DNS-1035 label: JobSet names a headless Service after the TrainJob.
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _render(**overrides):
    cfg = load_config(preset="qwen3.6-27b", overrides={"training.num_nodes": 4, **overrides})
    sel = {"pool": "b200"}
    tol = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    job = render_trainjob(cfg, fingerprint=FP, image="reg/flashdraft-trainer:t", namespace="team", node_selector=sel,
                          tolerations=tol, gpus_per_node=8, s3_secret_name="my-s3",
                          tracking_secret_name="my-tracking", hub_secret_name="my-hub")
    return cfg, job, sel, tol


def test_trainjob_uses_pinned_api_fields_and_places_nodes():
    cfg, job, sel, tol = _render()
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    spec = job["spec"]
    assert set(spec) <= SPEC_FIELDS
    assert set(spec["trainer"]) <= TRAINER_FIELDS
    assert not any(stale in yaml.safe_dump(job) for stale in STALE_FIELDS)
    assert spec["runtimeRef"]["name"] == "torch-distributed"
    assert spec["trainer"]["numNodes"] == 4 and spec["trainer"]["numProcPerNode"] == 8
    pool = cfg.pools.trainer
    requests = {"cpu": pool.cpu_request, "memory": pool.memory_request,
                "ephemeral-storage": pool.ephemeral_storage_request}
    # limits = requests (memory: OOM in its own cgroup, never node pressure), the disk its caches need reserved
    assert spec["trainer"]["resourcesPerNode"] == {"requests": requests, "limits": {**requests, "nvidia.com/gpu": 8}}
    pod = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod_spec = pod["template"]["spec"]["template"]["spec"]
    assert pod["name"] == "node"
    assert pod_spec["nodeSelector"] == sel and pod_spec["tolerations"] == tol
    assert pod_spec["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": cfg.pools.trainer.shm_size}
    # Pod Security "restricted" as the images' uid, a read-only root: the node writes only /tmp, /cache, /dev/shm
    (container,) = pod_spec["containers"]
    assert pod_spec["securityContext"]["runAsUser"] == 10001 and pod_spec["securityContext"]["runAsNonRoot"]
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/dev/shm", "/tmp", "/cache", "/work",
                                                                    "/home/flashdraft"}
    assert spec["trainer"]["command"][-1].count(" > /tmp/"), "the config file goes to a writable volume"
    env = {e["name"]: e for e in spec["trainer"]["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "my-s3",
                                                                         "key": "AWS_SECRET_ACCESS_KEY"}
    assert "value" not in env["AWS_SECRET_ACCESS_KEY"]
    assert "optional" not in env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"], "S3 keys are required"
    # the trackers' settings as on every stage pod: by reference, optional (no Secret, or only some keys: it runs)
    for key in TRACKING_SECRET_KEYS:
        assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "my-tracking", "key": key,
                                                                         "optional": True}}}, key
    # the Hub's token and mirror likewise: by reference to the hub Secret, optional (public repositories need none)
    for key in HUB_SECRET_KEYS:
        assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "my-hub", "key": key,
                                                                         "optional": True}}}, key
    # the job trains on exactly the resolved config, launched by torchrun from the PET_* env
    shipped = yaml.safe_load(env["FLASHDRAFT_CONFIG_YAML"]["value"])
    assert shipped["training"]["num_nodes"] == 4 and shipped["run_id"] == cfg.run_id
    assert "torchrun" in spec["trainer"]["command"][-1]


def test_trainjob_manifest_is_valid_kubernetes_metadata():
    _, job, _, _ = _render(run_id="My_Run.v2")
    name = job["metadata"]["name"]
    assert name.startswith("my-run-v2-") and name.endswith("-train") and DNS_1035.match(name), name
    assert job["metadata"]["annotations"][FINGERPRINT_KEY] == FP == job["metadata"]["labels"][FINGERPRINT_KEY]


@pytest.mark.parametrize("run_id", ["a_b", "a-b", "a.b", "A-b", "9lives", "x" * 63, "a" + "_" * 61 + "b", "r"])
def test_trainjob_names_are_distinct_dns_labels_for_each_exact_run_id(run_id):
    name = trainjob_name(run_id)
    assert DNS_1035.match(name) and len(name) <= NAME_MAX_CHARS <= 63, name
    assert name == trainjob_name(run_id), "deterministic: a retried launcher finds its job"


def test_run_ids_that_differ_only_in_punctuation_or_case_get_distinct_trainjob_names():
    ids = ["a_b", "a-b", "a.b", "A-b", "x" * 62 + "1", "x" * 62 + "2"]
    assert len({trainjob_name(i) for i in ids}) == len(ids)


def _job(fingerprint: str | None = FP, condition: str | None = None, deleting: bool = False) -> dict:
    meta: dict = {"name": "r-train", "annotations": {FINGERPRINT_KEY: fingerprint} if fingerprint else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    conds = [{"type": condition, "status": "True", "message": "why"}] if condition else []
    return {"metadata": meta, "status": {"conditions": conds}}


@pytest.mark.parametrize(("existing", "action", "why"), [
    (None, "create", "no TrainJob"),
    (_job(), "adopt", "this task's fingerprint"),
    (_job(OTHER_FP), "replace", f"task fingerprint {OTHER_FP}"),
    (_job(None), "replace", "not recorded"),  # made by an older flashdraft: its inputs are unknown
    (_job(FP, "Complete"), "replace", "it is Complete"),  # a retry would "finish" without training
    (_job(OTHER_FP, "Complete"), "replace", "it is Complete"),  # training.max_steps raised since
    (_job(FP, "Failed"), "replace", "it is Failed (why)"),  # every retry would fail at once
    (_job(FP, deleting=True), "replace", "being deleted"),
], ids=["none", "running-same", "running-other", "running-unlabelled", "complete-same", "complete-other",
        "failed-same", "deleting"])
def test_adoption_adopts_only_a_running_job_of_the_same_fingerprint(existing, action, why):
    decision = adoption(existing, FP)
    assert decision.action == action and why in decision.reason, decision


class FakeCustomObjectsApi:
    """An in-process stand-in for kubernetes' CustomObjectsApi (no API server runs here; tests/k8s runs the same
    flows against a real one): objects by name, 409 on a second create, 404 when absent, and a deletion that
    takes `deletion_polls` reads to finish (a finalizer)."""

    def __init__(self, deletion_polls: int = 2):
        self.objects: dict[str, dict] = {}
        self.created = self.deleted = 0
        self.deletion_polls = deletion_polls
        self._going: dict[str, int] = {}

    @staticmethod
    def _error(status: int):
        from kubernetes.client.rest import ApiException

        return ApiException(status=status, reason={404: "NotFound", 409: "AlreadyExists"}[status])

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if name in self._going:
            self._going[name] -= 1
            if self._going[name] <= 0:
                del self._going[name], self.objects[name]
        if name not in self.objects:
            raise self._error(404)
        return self.objects[name]

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, field_validation=None):
        name = body["metadata"]["name"]
        if name in self.objects:
            raise self._error(409)
        self.created += 1
        self.objects[name] = {**body, "metadata": {**body["metadata"], "uid": f"uid-{self.created}"}}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, propagation_policy=None):
        if name not in self.objects:
            raise self._error(404)
        assert propagation_policy == "Foreground", "the old job's pods must go before a new one reuses the name"
        self.deleted += 1
        self.objects[name]["metadata"]["deletionTimestamp"] = "now"
        self._going[name] = self.deletion_polls


def _body(fingerprint: str = FP) -> dict:
    return {"metadata": {"name": "r-1234abcd-train", "namespace": "team",
                         "annotations": {FINGERPRINT_KEY: fingerprint}}, "status": {}}


@pytest.mark.parametrize(("fingerprint", "condition"), [(OTHER_FP, "Complete"), (FP, "Failed"), (OTHER_FP, None)],
                         ids=["complete-other", "failed-same", "running-other"])
def test_ensure_trainjob_deletes_waits_and_replaces_fake_api(fingerprint, condition):
    api = FakeCustomObjectsApi(deletion_polls=3)
    api.create_namespaced_custom_object("g", "v", "team", "trainjobs", _body(fingerprint))
    if condition:
        api.objects["r-1234abcd-train"]["status"] = {"conditions": [{"type": condition, "status": "True"}]}
    decision = ensure_trainjob(api, _body(), poll_s=0.0)
    assert decision.action == "replace"
    job = api.objects["r-1234abcd-train"]
    assert api.deleted == 1 and job["metadata"]["uid"] == "uid-2" and "deletionTimestamp" not in job["metadata"]
    assert job["metadata"]["annotations"][FINGERPRINT_KEY] == FP


def test_ensure_trainjob_adopts_a_running_one_and_creates_a_missing_one_fake_api():
    api = FakeCustomObjectsApi()
    assert ensure_trainjob(api, _body(), poll_s=0.0).action == "create"
    assert ensure_trainjob(api, _body(), poll_s=0.0).action == "adopt"
    assert (api.created, api.deleted) == (1, 0)


def test_ensure_trainjob_gives_up_on_a_job_that_will_not_go_fake_api():
    api = FakeCustomObjectsApi(deletion_polls=10**9)
    api.create_namespaced_custom_object("g", "v", "team", "trainjobs", _body(OTHER_FP))
    with pytest.raises(TrainJobError, match="still there after 0 s"):
        ensure_trainjob(api, _body(), poll_s=0.0, delete_timeout_s=0.0)


def test_trainjob_state_reads_conditions():
    assert trainjob_state({})[0] == "Running"
    assert trainjob_state({"status": {"conditions": [{"type": "Failed", "status": "True", "message": "OOM"}]}}) == (
        "Failed", "OOM")
    assert trainjob_state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})[0] == "Complete"


def test_plan_gate_refuses_a_config_the_dag_was_not_compiled_for():
    cfg = stage_config(yaml.safe_dump(load_config(preset="tiny").model_dump(mode="json")), {"mode.kind": "streaming"})
    assert cfg.mode.kind == "streaming"
    check_compiled_shape(cfg, "streaming", 1)
    with pytest.raises(ConfigError, match="compiled for mode 'offline'"):
        check_compiled_shape(cfg, "offline", 1)
    with pytest.raises(ConfigError, match="num_nodes"):
        check_compiled_shape(cfg, "streaming", 2)
    only = stage_config(yaml.safe_dump(load_config(preset="tiny").model_dump(mode="json")),
                        {"drafter.init": "pretrained", "drafter.init_from": "hf:a/b", "training.max_steps": 0})
    check_compiled_shape(only, "offline", 1, compiled_evaluate_only=True)
    with pytest.raises(ConfigError, match="evaluates a pretrained drafter only, but the pipeline was compiled with"):
        check_compiled_shape(only, "offline", 1)
    with pytest.raises(ConfigError, match="this run trains, but the pipeline was compiled without"):
        check_compiled_shape(cfg.with_overrides({"mode.kind": "offline"}), "offline", 1, compiled_evaluate_only=True)
    reader = cfg.with_overrides({"mode.kind": "offline", "data.features_from": "file:///runs/base"})
    check_compiled_shape(reader, "offline", 1, compiled_features_from=True)
    with pytest.raises(ConfigError, match="compiled with its own prep, generate and extract"):
        check_compiled_shape(reader, "offline", 1)
    with pytest.raises(ConfigError, match="compiled without its own prep"):
        check_compiled_shape(cfg.with_overrides({"mode.kind": "offline"}), "offline", 1, compiled_features_from=True)


def test_the_launcher_puts_the_runners_train_fingerprint_on_the_job_mock_launch(tmp_path, monkeypatch):
    """pipelines/runtime.py trainjob_task with launch_and_wait replaced (no API server here): the fingerprint the
    job carries is the one the runner records for the train task, so a retry compares like with like."""
    from flashdraft.pipelines import runtime, trainjob
    from flashdraft.run.status import read_record
    from flashdraft.storage.store import open_store

    seen = {}

    def launch(cfg, *, fingerprint, **_):
        seen["fingerprint"] = fingerprint
        return {"trainjob": trainjob_name(cfg.run_id), "namespace": "team", "state": "Complete", "message": "",
                "wall_s": 1.0}

    monkeypatch.setattr(trainjob, "launch_and_wait", launch)
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store"})
    runtime.trainjob_task(yaml.safe_dump(cfg.model_dump(mode="json")), {}, None, image="i", namespace="team",
                          node_selector={}, tolerations=[], gpus_per_node=8, s3_secret_name="s",
                          tracking_secret_name="t", runtime_ref="torch-distributed")
    assert seen["fingerprint"] == read_record(open_store(cfg.storage, cfg.run_id), "train").fingerprint
