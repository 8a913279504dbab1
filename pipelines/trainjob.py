"""Multi-node training through a Kubeflow Trainer `TrainJob` (KFP has no multi-pod task).

Pinned to `trainer.kubeflow.org/v1alpha1` with Trainer >= 2.2 field names: `runtimeRef`, `trainer{image, command,
env, numNodes, resourcesPerNode, numProcPerNode}`, and `runtimePatches` for placement (it was podSpecOverrides in
2.0 and podTemplateOverrides in 2.1). `render_trainjob` is pure so tests validate the manifest; `launch_and_wait`
(through `create_trainjob`, `ensure_trainjob` and `unschedulable_pods`) is the only place that talks to the
Kubernetes API, and it turns the server's refusals and the scheduler's reasons into readable `TrainJobError`s.

Resume: the job's name is derived from the exact run_id (with a hash of it, so `a_b` and `a-b` differ) and the job
carries the train task's fingerprint (flashdraft/run/runner.py). A retried launcher adopts an existing job only
while it runs with that fingerprint; a finished or failed one, or one made for other inputs (more
`training.max_steps`, other features), is deleted and replaced (`adoption`), so a retry never "finishes" on an old
result or fails at once on an old failure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

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


# The train task's fingerprint (flashdraft/run/runner.py: 16 hex digits, so it fits a label value too).
FINGERPRINT_KEY = "flashdraft.io/task-fingerprint"
RUN_ID_KEY = "flashdraft.io/run-id"
# JobSet names the node Jobs and pods `<name>-node-<job>-<pod>`, and pod hostnames must stay within 63
# characters: a name of at most 45 leaves room for 9999 nodes.
NAME_MAX_CHARS = 45
# How long a replaced TrainJob may take to go (Trainer's finalizers delete its JobSet and pods first).
DELETE_TIMEOUT_S = 600.0


def trainjob_name(run_id: str) -> str:
    """Deterministic, so a retried launcher finds its job instead of starting a second one; a DNS-1035 label
    (JobSet names a Service after it) of at most NAME_MAX_CHARS. The readable part is the run_id lowered with `_`
    and `.` as `-`; 8 hex digits of the exact run_id's sha256 keep runs whose ids differ only there apart."""
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    suffix = f"-{digest}-train"
    slug = re.sub(r"[^a-z0-9-]", "-", run_id.lower())
    slug = re.sub(r"-+", "-", slug).strip("-")
    if not slug[:1].isalpha():
        slug = f"fd-{slug}".rstrip("-")
    return slug[: NAME_MAX_CHARS - len(suffix)].rstrip("-") + suffix


def render_trainjob(cfg: RunConfig, *, fingerprint: str, image: str, namespace: str, node_selector: dict[str, str],
                    tolerations: list[dict[str, Any]], gpus_per_node: int, s3_secret_name: str,
                    tracking_secret_name: str, hub_secret_name: str,
                    runtime_ref: str = "torch-distributed") -> dict[str, Any]:
    """The TrainJob manifest for `cfg` (the resolved config travels in an env var, credentials by secretKeyRef:
    the S3 keys required, the trackers' and the Hub's optional, as on every stage pod); `fingerprint`: the train
    task's, as a label and an annotation (what `adoption` compares)."""
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
        "metadata": {"name": trainjob_name(cfg.run_id), "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "flashdraft", RUN_ID_KEY: cfg.run_id,
                                FINGERPRINT_KEY: fingerprint},
                     "annotations": {FINGERPRINT_KEY: fingerprint, RUN_ID_KEY: cfg.run_id}},
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


@dataclass(frozen=True)
class Adoption:
    """What the launcher does with the TrainJob of its name (`adoption`), and why, for its log."""

    action: Literal["create", "adopt", "replace"]
    reason: str


def adoption(existing: dict[str, Any] | None, fingerprint: str) -> Adoption:
    """Adopt an existing TrainJob only while it runs for this very task (same fingerprint, not being deleted):
    a Complete one would "finish" a retry without training (after `training.max_steps` was raised), a Failed one
    fail it at once, and one of another fingerprint train on other inputs. Those are replaced."""
    if existing is None:
        return Adoption("create", "no TrainJob of this name")
    meta = existing.get("metadata") or {}
    theirs = (meta.get("annotations") or {}).get(FINGERPRINT_KEY) or (meta.get("labels") or {}).get(FINGERPRINT_KEY)
    state, message = trainjob_state(existing)
    if meta.get("deletionTimestamp"):
        return Adoption("replace", "it is being deleted")
    if state != "Running":
        return Adoption("replace", f"it is {state}" + (f" ({message})" if message else ""))
    if theirs != fingerprint:
        return Adoption("replace", f"it runs for other inputs (task fingerprint {theirs or 'not recorded'}, this "
                                   f"task's {fingerprint})")
    return Adoption("adopt", "it runs with this task's fingerprint (an earlier attempt's)")


def get_trainjob(api: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The TrainJob, or None when there is none; a refusal raises TrainJobError with the server's message."""
    from kubernetes.client.rest import ApiException

    try:
        return api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        hint = _REFUSAL_HINTS.get(exc.status)
        raise TrainJobError(f"reading TrainJob {namespace}/{name} failed: {api_error_message(exc)}"
                            + (f" ({hint})" if hint else "")) from None


def delete_trainjob(api: Any, namespace: str, name: str, *, poll_s: float = 1.0,
                    timeout_s: float = DELETE_TIMEOUT_S) -> None:
    """Delete the TrainJob (foreground: its JobSet and pods go first) and wait until it is gone, so the job that
    replaces it never shares a name with pods of the old one."""
    from kubernetes.client.rest import ApiException

    try:
        api.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name,
                                            propagation_policy="Foreground")
    except ApiException as exc:
        if exc.status != 404:
            raise TrainJobError(f"deleting TrainJob {namespace}/{name} failed: {api_error_message(exc)}") from None
    deadline = time.monotonic() + timeout_s
    while get_trainjob(api, namespace, name) is not None:
        if time.monotonic() > deadline:
            raise TrainJobError(f"TrainJob {namespace}/{name} was deleted but is still there after {timeout_s:.0f} s "
                                "(a finalizer the Trainer controller did not remove?): delete it with kubectl and "
                                "retry the run")
        time.sleep(poll_s)


def ensure_trainjob(api: Any, body: dict[str, Any], *, poll_s: float = 1.0,
                    delete_timeout_s: float = DELETE_TIMEOUT_S) -> Adoption:
    """Make `body`'s TrainJob the one that runs: create it, adopt the running one of the same fingerprint, or
    delete and replace any other (`adoption`). Returns the decision taken. A job created between the read and the
    create (another launcher attempt of the same task) is decided on again."""
    meta = body["metadata"]
    namespace, name, fingerprint = meta["namespace"], meta["name"], meta["annotations"][FINGERPRINT_KEY]
    for _ in range(3):
        decision = adoption(get_trainjob(api, namespace, name), fingerprint)
        if decision.action == "adopt":
            return decision
        if decision.action == "replace":
            log.warning("TrainJob %s/%s: replacing it: %s", namespace, name, decision.reason)
            delete_trainjob(api, namespace, name, poll_s=poll_s, timeout_s=delete_timeout_s)
        if create_trainjob(api, body):
            return decision
    raise TrainJobError(f"TrainJob {namespace}/{name} was recreated three times while this launcher replaced it: "
                        "is another launcher of this run running?")


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


def launch_and_wait(cfg: RunConfig, *, fingerprint: str, config_yaml: str, overrides: dict[str, Any], image: str,
                    namespace: str, node_selector: dict[str, str], tolerations: list[dict[str, Any]],
                    gpus_per_node: int, s3_secret_name: str, tracking_secret_name: str, hub_secret_name: str,
                    runtime_ref: str,
                    poll_s: float = 30.0,
                    unschedulable_timeout_s: float = UNSCHEDULABLE_TIMEOUT_S) -> dict[str, Any]:
    """Create the TrainJob (or adopt the running one a previous attempt created for the same task fingerprint,
    or replace any other: `ensure_trainjob`), poll until it ends, raise on failure.

    Pods the scheduler cannot place are reported with its reason at every poll; after `unschedulable_timeout_s`
    of that (long enough for a node autoscaler) the TrainJob is deleted and the step fails with the reason.
    """
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    del config_yaml, overrides  # `cfg` already has both applied; the job gets the resolved config
    _load_kube_config()
    namespace = namespace or Path(POD_NAMESPACE_FILE).read_text().strip()
    api, core = client.CustomObjectsApi(), client.CoreV1Api()
    body = render_trainjob(cfg, fingerprint=fingerprint, image=image, namespace=namespace, node_selector=node_selector,
                           tolerations=tolerations, gpus_per_node=gpus_per_node, s3_secret_name=s3_secret_name,
                           tracking_secret_name=tracking_secret_name, hub_secret_name=hub_secret_name,
                           runtime_ref=runtime_ref)
    name = body["metadata"]["name"]
    decision = ensure_trainjob(api, body, poll_s=min(poll_s, 5.0))
    if decision.action == "adopt":
        log.info("TrainJob %s/%s exists: %s; waiting for it", namespace, name, decision.reason)
    else:
        log.info("created TrainJob %s/%s (%d nodes x %d procs; %s)", namespace, name, cfg.training.num_nodes,
                 cfg.training.nproc_per_node, decision.reason)
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
