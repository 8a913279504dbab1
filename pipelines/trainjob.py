"""Multi-node training through a Kubeflow Trainer `TrainJob` (KFP has no multi-pod task).

Pinned to `trainer.kubeflow.org/v1alpha1` with Trainer >= 2.2 field names: `runtimeRef`, `trainer{image, command,
env, numNodes, resourcesPerNode, numProcPerNode}`, and `runtimePatches` for placement (it was podSpecOverrides in
2.0 and podTemplateOverrides in 2.1). `render_trainjob` is pure so tests validate the manifest; `launch_and_wait`
(through `create_trainjob` and `unschedulable_pods`) is the only place that talks to the Kubernetes API, and it
turns the server's refusals and the scheduler's reasons into readable `TrainJobError`s.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from flashdraft.config import PoolConfig, RunConfig, dump_config
from flashdraft.pipelines.placement import APP_UID, CACHE_DIR
from flashdraft.pipelines.secret_env import HUB_SECRET_KEYS, S3_SECRET_KEYS, TRACKING_SECRET_KEYS, secret_key_refs

log = logging.getLogger(__name__)

API_GROUP = "trainer.kubeflow.org"
API_VERSION = "v1alpha1"
PLURAL = "trainjobs"
# The runtime's node replicated job (ClusterTrainingRuntime torch-distributed) and its container.
NODE_JOB = "node"
# Trainer runs a TrainJob as a JobSet of the same name; JobSet labels every pod with it.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# How long the TrainJob's pods may stay unschedulable before the launcher gives up (a GPU node autoscaler can take
# many minutes to add nodes).
UNSCHEDULABLE_TIMEOUT_S = 1800.0
CONFIG_ENV = "FLASHDRAFT_CONFIG_YAML"
CONFIG_PATH = "/tmp/flashdraft-config.yaml"
# An empty namespace parameter means the launcher pod's own (the run's profile namespace on multi-user Kubeflow).
POD_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# torchrun takes nnodes/nproc/rank/master from the PET_* env the Trainer's torch plugin sets on every node.
COMMAND = ["sh", "-c", f'printf "%s" "${CONFIG_ENV}" > {CONFIG_PATH} && '
                       f"exec torchrun -m flashdraft.components.train.launch --config {CONFIG_PATH}"]


# Pod Security "restricted", and a read-only root: a node writes only to these volumes, bounded by its
# ephemeral-storage limit: the config file and torch's scratch under /tmp, the Hub/Triton caches under /cache, what
# libraries write relative to the working directory (W&B's ./wandb) under /work, and the user's HOME (W&B's
# settings). /work and the home are the images' (docker/*/Dockerfile WORKDIR, docker/install.sh `useradd`).
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": APP_UID, "runAsGroup": APP_UID, "fsGroup": APP_UID,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"runAsNonRoot": True, "runAsUser": APP_UID, "allowPrivilegeEscalation": False,
                      "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
WRITABLE = {"tmp": "/tmp", "cache": CACHE_DIR, "work": "/work", "home": "/home/flashdraft"}


def node_resources(pool: PoolConfig, gpus_per_node: int) -> dict[str, Any]:
    """A node's requests and limits: limits = requests (as on stage pods, pipelines/placement.py `harden`), the
    ephemeral-storage request reserving the disk its caches need, and the GPUs."""
    requests = {"cpu": pool.cpu_request, "memory": pool.memory_request,
                "ephemeral-storage": pool.ephemeral_storage_request}
    limits: dict[str, Any] = dict(requests)
    if pool.accelerator_type and gpus_per_node > 0:
        limits[pool.accelerator_type] = gpus_per_node
    return {"requests": requests, "limits": limits}


def trainjob_name(cfg: RunConfig) -> str:
    """Deterministic, so a retried launcher finds its job instead of starting a second one."""
    return f"{cfg.run_id.lower().replace('_', '-').replace('.', '-')}-train"[:63].rstrip("-")


def render_trainjob(cfg: RunConfig, *, image: str, namespace: str, node_selector: dict[str, str],
                    tolerations: list[dict[str, Any]], gpus_per_node: int, s3_secret_name: str,
                    tracking_secret_name: str, hub_secret_name: str,
                    runtime_ref: str = "torch-distributed") -> dict[str, Any]:
    """The TrainJob manifest for `cfg` (the resolved config travels in an env var, credentials by secretKeyRef:
    the S3 keys required, the trackers' and the Hub's optional, as on every stage pod)."""
    pool = cfg.pools.trainer
    env = [{"name": CONFIG_ENV, "value": dump_config(cfg)},
           *secret_key_refs(s3_secret_name, S3_SECRET_KEYS, optional=False),
           *secret_key_refs(tracking_secret_name, TRACKING_SECRET_KEYS, optional=True),
           *secret_key_refs(hub_secret_name, HUB_SECRET_KEYS, optional=True)]
    resources = node_resources(pool, gpus_per_node)
    pod_spec: dict[str, Any] = {"nodeSelector": dict(node_selector), "tolerations": list(tolerations),
                                "securityContext": POD_SECURITY}
    shm: dict[str, Any] = {"medium": "Memory"}
    if pool.shm_size:
        shm["sizeLimit"] = pool.shm_size
    pod_spec["volumes"] = [{"name": "dshm", "emptyDir": shm}, *({"name": v, "emptyDir": {}} for v in WRITABLE)]
    pod_spec["containers"] = [{
        "name": NODE_JOB, "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         *({"name": v, "mountPath": path} for v, path in WRITABLE.items())]}]
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


class TrainJobError(RuntimeError):
    """A TrainJob the API server refused, one that failed, or one whose pods cannot be placed: the message says
    which, in the server's or the scheduler's own words."""


# A refusal's likely cause, by HTTP status, for the person reading the failed launcher step.
_REFUSAL_HINTS = {
    403: "the run's ServiceAccount needs create on trainjobs.trainer.kubeflow.org in that namespace (Helm chart: "
         "multiNode.enabled=true, multiNode.trainJobNamespace, rbac.extraSubjects)",
    404: "is Kubeflow Trainer (the TrainJob CRD) installed, and does the namespace exist?",
    422: "the manifest does not match this cluster's TrainJob CRD (flashdraft renders trainer.kubeflow.org/v1alpha1 "
         "for Trainer >= 2.2)",
}
_REFUSAL_HINTS[400] = _REFUSAL_HINTS[422]  # strict field validation: an unknown field (an older Trainer's CRD)


def api_error_message(exc: Any) -> str:
    """'<code> <reason>: <message>' from a kubernetes ApiException: the Status the server sent, not the HTTP dump."""
    try:
        status = json.loads(exc.body or "")
    except (TypeError, ValueError):
        status = {}
    reason = status.get("reason") or exc.reason or "Error"
    return f"{exc.status} {reason}: {status.get('message') or exc.reason}"


def create_trainjob(api: Any, body: dict[str, Any]) -> bool:
    """Create `body` with strict field validation (an unknown or renamed field is refused, never silently pruned
    by the CRD schema); False when a previous attempt already created it. Any other refusal raises
    TrainJobError with the server's message and a hint."""
    from kubernetes.client.rest import ApiException

    meta = body["metadata"]
    try:
        api.create_namespaced_custom_object(API_GROUP, API_VERSION, meta["namespace"], PLURAL, body,
                                            field_validation="Strict")
        return True
    except ApiException as exc:
        if exc.status == 409:
            return False
        hint = _REFUSAL_HINTS.get(exc.status)
        raise TrainJobError(f"the API server refused TrainJob {meta['namespace']}/{meta['name']}: "
                            f"{api_error_message(exc)}" + (f" ({hint})" if hint else "")) from None


def unschedulable_pods(core: Any, namespace: str, name: str) -> list[str]:
    """'<pod>: <the scheduler's reason>' for each pod of TrainJob `name` that the scheduler could not place."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}").items
    return [f"{pod.metadata.name}: {cond.message}" for pod in pods for cond in (pod.status.conditions or [])
            if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable"]


def _load_kube_config() -> None:
    """In a pod: its ServiceAccount. Elsewhere (a developer's shell, the k8s test tier): KUBECONFIG."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:  # read KUBECONFIG now: the client's own default was fixed at import time
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))


def launch_and_wait(cfg: RunConfig, *, config_yaml: str, overrides: dict[str, Any], image: str, namespace: str,
                    node_selector: dict[str, str], tolerations: list[dict[str, Any]], gpus_per_node: int,
                    s3_secret_name: str, tracking_secret_name: str, hub_secret_name: str, runtime_ref: str,
                    poll_s: float = 30.0,
                    unschedulable_timeout_s: float = UNSCHEDULABLE_TIMEOUT_S) -> dict[str, Any]:
    """Create the TrainJob (or adopt the one a previous attempt created), poll until it ends, raise on failure.

    Pods the scheduler cannot place are reported with its reason at every poll; after `unschedulable_timeout_s`
    of that (long enough for a node autoscaler) the TrainJob is deleted and the step fails with the reason.
    """
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    del config_yaml, overrides  # `cfg` already has both applied; the job gets the resolved config
    _load_kube_config()
    namespace = namespace or Path(POD_NAMESPACE_FILE).read_text().strip()
    api, core = client.CustomObjectsApi(), client.CoreV1Api()
    body = render_trainjob(cfg, image=image, namespace=namespace, node_selector=node_selector,
                           tolerations=tolerations, gpus_per_node=gpus_per_node, s3_secret_name=s3_secret_name,
                           tracking_secret_name=tracking_secret_name, hub_secret_name=hub_secret_name,
                           runtime_ref=runtime_ref)
    name = body["metadata"]["name"]
    if create_trainjob(api, body):
        log.info("created TrainJob %s/%s (%d nodes x %d procs)", namespace, name, cfg.training.num_nodes,
                 cfg.training.nproc_per_node)
    else:
        log.info("TrainJob %s/%s exists (earlier attempt); waiting for it", namespace, name)
    start = time.monotonic()
    stuck_since: float | None = None
    pods_forbidden = False
    while True:
        obj = api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
        state, message = trainjob_state(obj)
        if state == "Failed":
            raise TrainJobError(f"TrainJob {namespace}/{name} failed: {message}")
        if state == "Complete":
            return {"trainjob": name, "namespace": namespace, "state": state, "message": message,
                    "wall_s": round(time.monotonic() - start, 1)}
        try:
            stuck = unschedulable_pods(core, namespace, name)
        except ApiException as exc:  # an older chart's Role cannot list pods: wait without the diagnosis
            if exc.status != 403:
                raise
            if not pods_forbidden:
                log.warning("cannot list pods in %s (%s): unschedulable TrainJob pods will not be reported",
                            namespace, api_error_message(exc))
            pods_forbidden, stuck = True, []
        if not stuck:
            stuck_since = None
        else:
            stuck_since = stuck_since if stuck_since is not None else time.monotonic()
            waited = time.monotonic() - stuck_since
            log.warning("TrainJob %s/%s: %d pod(s) cannot be scheduled for %.0f s: %s", namespace, name,
                        len(stuck), waited, "; ".join(stuck))
            if waited >= unschedulable_timeout_s:
                api.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
                raise TrainJobError(
                    f"TrainJob {namespace}/{name} deleted: its pods could not be scheduled for {waited:.0f} s: "
                    f"{stuck[0]} (check trainer_node_selector, trainer_tolerations and trainer_gpus against "
                    "`kubectl get nodes -L nvidia.com/gpu.product` and the nodes' taints)")
        time.sleep(poll_s)
