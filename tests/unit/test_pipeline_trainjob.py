"""The multi-node TrainJob manifest (pinned Trainer API) and the plan gate's DAG-shape check."""

from __future__ import annotations

import pytest
import yaml

from flashdraft.config import ConfigError, load_config
from flashdraft.pipelines.runtime import check_compiled_shape, stage_config
from flashdraft.pipelines.secret_env import HUB_SECRET_KEYS, TRACKING_SECRET_KEYS
from flashdraft.pipelines.trainjob import render_trainjob, trainjob_state

# Field names of trainer.kubeflow.org/v1alpha1 as of Trainer 2.2+ (TrainJobSpec / Trainer).
SPEC_FIELDS = {"runtimeRef", "trainer", "runtimePatches", "initializer", "labels", "annotations", "suspend",
               "managedBy", "activeDeadlineSeconds"}
TRAINER_FIELDS = {"image", "command", "args", "env", "numNodes", "resourcesPerNode", "numProcPerNode"}
STALE_FIELDS = ("podSpecOverrides", "podTemplateOverrides")


def _render(**overrides):
    cfg = load_config(preset="qwen3.6-27b", overrides={"training.num_nodes": 4, **overrides})
    sel = {"pool": "b200"}
    tol = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    job = render_trainjob(cfg, image="reg/flashdraft-trainer:t", namespace="team", node_selector=sel,
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
    assert name == "my-run-v2-train"
    assert len(name) <= 63 and name.replace("-", "").isalnum() and name == name.lower()


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
