"""Pods built from a compiled flashdraft pipeline exactly as KFP's driver would place them, and a scheduling probe.

Everything a stage pod carries that matters to admission and the scheduler (node selector, tolerations, CPU and
memory requests and limits, accelerator limits, /dev/shm and /cache, deadline, the S3 and tracking Secrets' env,
the security context) is read from the compiled PipelineSpec and its kubernetes platform spec, with each
pipeline-parameter reference followed up the DAG to the root default; what KFP's backend adds to every task pod
by itself is KFP_CONTAINER_DEFAULTS / KFP_POD_DEFAULTS. Nothing is restated from flashdraft's config, so a
placement bug in the pipeline shows up here.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

_PARAM_REF = re.compile(r"^\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}$")


# Where each stage must run: the product's intent (the placement itself is read from the compiled spec). Checked
# against the compiled pipeline without a server (tests/integration/test_cluster_contract.py) and by a real scheduler
# where a control plane is provided (tests/k8s/test_placement.py).
STAGE_POOL = {
    "plan": "cpu", "prep": "cpu", "report": "cpu", "export": "cpu", "stream-end": "cpu", "train-launcher": "cpu",
    "generate": "inference", "extract": "inference", "evaluate": "inference", "train": "trainer",
}

# What KFP 2.17's backend puts on every task container and pod whatever the pipeline says (the Argo compiler's
# platform security defaults, kubeflow/pipelines#12782; kfp.kubernetes.set_security_context's docstring names
# them). The pipeline's own securityContext (runAsUser/runAsGroup/runAsNonRoot) comes on top, from the platform spec.
KFP_CONTAINER_DEFAULTS = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                          "seccompProfile": {"type": "RuntimeDefault"}}
KFP_POD_DEFAULTS = {"seccompProfile": {"type": "RuntimeDefault"}}


class UnresolvedInput(LookupError):
    """A parameter reference KFP's driver could not resolve: the task would fail before its pod is created."""


@dataclass(frozen=True)
class StagePod:
    """One executor of the compiled pipeline: the stage (task display name) and the pod spec KFP would run."""

    executor: str
    stage: str
    spec: dict[str, Any]


class CompiledPipeline:
    """The two YAML documents `flashdraft compile` writes: PipelineSpec, then the kubernetes platform spec."""

    def __init__(self, pipeline_spec: dict[str, Any], platform_spec: dict[str, Any]):
        self.spec = pipeline_spec
        self.k8s = platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        self.containers = pipeline_spec["deploymentSpec"]["executors"]
        # component -> (the DAG holding the task that runs it, that task)
        self.owner: dict[str, tuple[str, dict[str, Any]]] = {}
        for parent, comp in {"root": pipeline_spec["root"], **pipeline_spec["components"]}.items():
            for task in comp.get("dag", {}).get("tasks", {}).values():
                self.owner[task["componentRef"]["name"]] = (parent, task)
        self.component_of = {comp["executorLabel"]: name for name, comp in pipeline_spec["components"].items()
                             if "executorLabel" in comp}

    def dag_input(self, dag: str, param: str) -> Any:
        """Input `param` of DAG `dag` (root: the pipeline parameter's default), as KFP's driver resolves it."""
        if dag == "root":
            return self.spec["root"]["inputDefinitions"]["parameters"][param]["defaultValue"]
        if param not in self.spec["components"][dag].get("inputDefinitions", {}).get("parameters", {}):
            raise UnresolvedInput(f"parent DAG {dag} does not have input parameter {param}: KFP's driver would fail "
                                  "the task before creating its pod")
        return self.task_arg(dag, param)

    def task_arg(self, component: str, param: str) -> Any:
        """The argument the task running `component` passes for `param`."""
        parent, task = self.owner[component]
        source = task["inputs"].get("parameters", {}).get(param)
        if source is None:
            raise UnresolvedInput(f"the task running {component} has no input {param}")
        if "componentInputParameter" in source:
            return self.dag_input(parent, source["componentInputParameter"])
        if "runtimeValue" in source:
            return source["runtimeValue"]["constant"]
        raise ValueError(f"{component}.{param} comes from {source}: not a pipeline parameter or constant")

    def platform_input(self, component: str, param: str) -> Any:
        """A kubernetes platform-spec reference (componentInputParameter): KFP's driver reads it from the inputs
        of the DAG that holds the task."""
        return self.dag_input(self.owner[component][0], param)

    def task_input(self, executor: str, param: str) -> Any:
        """A task's argument (e.g. the TrainJob launcher's node_selector), resolved to its default."""
        return self.task_arg(self.component_of[executor], param)

    def stage_pod(self, executor: str) -> StagePod:
        comp = self.component_of[executor]
        k8s, container = self.k8s.get(executor, {}), self.containers[executor]["container"]
        pod: dict[str, Any] = {"restartPolicy": "Never"}
        if "nodeSelector" in k8s:
            sel = k8s["nodeSelector"]
            pod["nodeSelector"] = (self.platform_input(comp, sel["nodeSelectorJson"]["componentInputParameter"])
                                   if "nodeSelectorJson" in sel else dict(sel.get("labels", {})))
        tolerations: list[dict[str, Any]] = []
        for tol in k8s.get("tolerations", []):
            if "tolerationJson" in tol:
                value = self.platform_input(comp, tol["tolerationJson"]["componentInputParameter"])
                tolerations += value if isinstance(value, list) else [value]
            else:
                tolerations.append(tol)
        if tolerations:
            pod["tolerations"] = tolerations
        if "activeDeadlineSeconds" in k8s:
            pod["activeDeadlineSeconds"] = int(k8s["activeDeadlineSeconds"])
        res = container.get("resources", {})
        requests = {k: res[f] for k, f in (("cpu", "resourceCpuRequest"), ("memory", "resourceMemoryRequest"))
                    if f in res}
        limits = {k: res[f] for k, f in (("cpu", "resourceCpuLimit"), ("memory", "resourceMemoryLimit")) if f in res}
        if "accelerator" in res:
            acc = res["accelerator"]
            count = acc.get("resourceCount", acc.get("count"))
            ref = _PARAM_REF.match(str(count))
            limits[acc["resourceType"]] = str(self.task_arg(comp, ref.group(1)) if ref else count)
        env = []
        for secret in k8s.get("secretAsEnv", []):
            name = (self.platform_input(comp, secret["secretNameParameter"]["componentInputParameter"])
                    if "secretNameParameter" in secret else secret["secretName"])
            optional = {"optional": True} if secret.get("optional") else {}  # false is the default
            env += [{"name": e["envVar"], "valueFrom": {"secretKeyRef": {"name": name, "key": e["secretKey"],
                                                                         **optional}}}
                    for e in secret["keyToEnv"]]
        mounts = [{"name": m["volumeName"], "mountPath": m["mountPath"]} for m in k8s.get("emptyDirMounts", [])]
        pod["volumes"] = [{"name": m["volumeName"], "emptyDir": {k: m[k] for k in ("medium", "sizeLimit") if m.get(k)}}
                          for m in k8s.get("emptyDirMounts", [])]
        security = dict(KFP_CONTAINER_DEFAULTS)
        for key, value in k8s.get("securityContext", {}).items():  # protojson writes int64 as a string
            security[key] = int(value) if key in ("runAsUser", "runAsGroup") else value
        pod["securityContext"] = dict(KFP_POD_DEFAULTS)
        pod["containers"] = [{"name": "main", "image": container["image"], "command": ["true"],
                              "resources": {"requests": requests, "limits": limits}, "env": env,
                              "volumeMounts": mounts, "securityContext": security}]
        _, task = self.owner[comp]
        return StagePod(executor, task["taskInfo"]["name"], pod)

    def stage_pods(self) -> list[StagePod]:
        return [self.stage_pod(executor) for executor in sorted(self.containers)]


def trainjob_node_pod(job: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a TrainJob's node as Kubeflow Trainer builds it: the pod template of `runtimePatches`, with
    the `trainer` fields (image, command, env, resourcesPerNode) on its node container."""
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = dict(node["template"]["spec"]["template"]["spec"])
    trainer = job["spec"]["trainer"]
    (container,) = pod["containers"]
    pod["containers"] = [{**container, "image": trainer["image"], "command": trainer["command"],
                          "env": trainer["env"], "resources": trainer["resourcesPerNode"]}]
    return pod


@dataclass(frozen=True)
class Scheduling:
    """What the real scheduler did with a pod: the node it bound it to, or why not (FailedScheduling)."""

    node: str | None
    reason: str


def wait_scheduled(core: Any, namespace: str, name: str, timeout_s: float = 30.0) -> Scheduling:
    """Poll until the pod is bound, or the scheduler has recorded a FailedScheduling event for it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.spec.node_name:
            return Scheduling(pod.spec.node_name, "")
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name},"
                                                                      "reason=FailedScheduling").items
        if events:
            return Scheduling(None, events[-1].message)
        time.sleep(0.2)
    raise TimeoutError(f"pod {namespace}/{name} neither scheduled nor refused within {timeout_s} s")


def create_pod(core: Any, namespace: str, name: str, spec: dict[str, Any],
               labels: dict[str, str] | None = None) -> None:
    core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod",
                                           "metadata": {"name": name, "labels": labels or {}}, "spec": spec})
