"""Multi-node training through a Kubeflow Trainer `TrainJob` (KFP has no multi-pod task).

Pinned to `trainer.kubeflow.org/v1alpha1` with Trainer >= 2.2 field names: `runtimeRef`, `trainer{image, command,
env, numNodes, resourcesPerNode, numProcPerNode}`, and `runtimePatches` for placement (it was podSpecOverrides in
2.0 and podTemplateOverrides in 2.1). `render_trainjob` is pure so tests validate the manifest; `launch_and_wait`
is the only place that talks to the Kubernetes API.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from flashdraft.config import RunConfig, dump_config

log = logging.getLogger(__name__)

API_GROUP = "trainer.kubeflow.org"
API_VERSION = "v1alpha1"
PLURAL = "trainjobs"
# The runtime's node replicated job (ClusterTrainingRuntime torch-distributed) and its container.
NODE_JOB = "node"
CONFIG_ENV = "FLASHDRAFT_CONFIG_YAML"
CONFIG_PATH = "/tmp/flashdraft-config.yaml"
# An empty namespace parameter means the launcher pod's own (the run's profile namespace on multi-user Kubeflow).
POD_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# torchrun takes nnodes/nproc/rank/master from the PET_* env the Trainer's torch plugin sets on every node.
COMMAND = ["sh", "-c", f'printf "%s" "${CONFIG_ENV}" > {CONFIG_PATH} && '
                       f"exec torchrun -m flashdraft.cli train --config {CONFIG_PATH}"]


def trainjob_name(cfg: RunConfig) -> str:
    """Deterministic, so a retried launcher finds its job instead of starting a second one."""
    return f"{cfg.run_id.lower().replace('_', '-').replace('.', '-')}-train"[:63].rstrip("-")


def render_trainjob(cfg: RunConfig, *, image: str, namespace: str, node_selector: dict[str, str],
                    tolerations: list[dict[str, Any]], gpus_per_node: int, s3_secret_name: str,
                    runtime_ref: str = "torch-distributed") -> dict[str, Any]:
    """The TrainJob manifest for `cfg` (the resolved config travels in an env var, credentials by secretKeyRef)."""
    pool = cfg.pools.trainer
    env = [{"name": CONFIG_ENV, "value": dump_config(cfg)}] + [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": s3_secret_name, "key": key}}}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    resources = {"requests": {"cpu": pool.cpu_request, "memory": pool.memory_request}}
    if pool.accelerator_type and gpus_per_node > 0:
        resources["limits"] = {pool.accelerator_type: gpus_per_node}
    pod_spec: dict[str, Any] = {"nodeSelector": dict(node_selector), "tolerations": list(tolerations)}
    shm: dict[str, Any] = {"medium": "Memory"}
    if pool.shm_size:
        shm["sizeLimit"] = pool.shm_size
    pod_spec["volumes"] = [{"name": "dshm", "emptyDir": shm}]
    pod_spec["containers"] = [{"name": NODE_JOB, "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": trainjob_name(cfg), "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "flashdraft", "flashdraft.io/run-id": cfg.run_id}},
        "spec": {
            "runtimeRef": {"name": runtime_ref, "apiGroup": API_GROUP, "kind": "ClusterTrainingRuntime"},
            "trainer": {
                "image": image,
                "command": COMMAND,
                "env": env,
                "numNodes": cfg.training.num_nodes,
                "numProcPerNode": cfg.training.nproc_per_node,
                "resourcesPerNode": resources,
            },
            "runtimePatches": [{
                "manager": "flashdraft.io/pipeline",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": NODE_JOB, "template": {"spec": {"template": {"spec": pod_spec}}}}]}}},
            }],
        },
    }


def trainjob_state(obj: dict[str, Any]) -> tuple[str, str]:
    """('Complete' | 'Failed' | 'Running', message) from a TrainJob's status conditions."""
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond["type"], cond.get("message", "")
    return "Running", ""


def launch_and_wait(cfg: RunConfig, *, config_yaml: str, overrides: dict[str, Any], image: str, namespace: str,
                    node_selector: dict[str, str], tolerations: list[dict[str, Any]], gpus_per_node: int,
                    s3_secret_name: str, runtime_ref: str, poll_s: float = 30.0) -> dict[str, Any]:
    """Create the TrainJob (or adopt the one a previous attempt created), poll until it ends, raise on failure."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    del config_yaml, overrides  # `cfg` already has both applied; the job gets the resolved config
    config.load_incluster_config()
    namespace = namespace or Path(POD_NAMESPACE_FILE).read_text().strip()
    api = client.CustomObjectsApi()
    body = render_trainjob(cfg, image=image, namespace=namespace, node_selector=node_selector,
                           tolerations=tolerations, gpus_per_node=gpus_per_node, s3_secret_name=s3_secret_name,
                           runtime_ref=runtime_ref)
    name = body["metadata"]["name"]
    try:
        api.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, body)
        log.info("created TrainJob %s/%s (%d nodes x %d procs)", namespace, name, cfg.training.num_nodes,
                 cfg.training.nproc_per_node)
    except ApiException as exc:
        if exc.status != 409:
            raise
        log.info("TrainJob %s/%s exists (earlier attempt); waiting for it", namespace, name)
    start = time.monotonic()
    while True:
        obj = api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
        state, message = trainjob_state(obj)
        if state == "Failed":
            raise RuntimeError(f"TrainJob {namespace}/{name} failed: {message}")
        if state == "Complete":
            return {"trainjob": name, "namespace": namespace, "state": state, "message": message,
                    "wall_s": round(time.monotonic() - start, 1)}
        time.sleep(poll_s)
