"""Placement by the real kube-scheduler: each stage's pod, built from exactly what the compiled pipeline carries,
lands on the right pool's fake node; impossible requests come back with the scheduler's FailedScheduling reason."""

from __future__ import annotations

import copy

import pytest
from fake_nodes import FAKE_NODES, POOL_NODES
from support.kfp_pods import STAGE_POOL, create_pod, wait_scheduled

pytestmark = pytest.mark.k8s

GPU_NODES = {n for n, spec in FAKE_NODES.items() if spec["gpus"]}


def _stage_pods(compiled_pipelines):
    """Every distinct executor over the three DAG shapes, once."""
    seen = {}
    for _, pipeline in compiled_pipelines.values():
        for pod in pipeline.stage_pods():
            seen.setdefault(pod.executor, pod)
    return list(seen.values())


def test_every_stage_lands_on_its_pools_node(k8s, kube_api, namespace, compiled_pipelines):
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    pods = _stage_pods(compiled_pipelines)
    assert {p.stage for p in pods} == set(STAGE_POOL), "a stage was added or renamed: say where it must run"
    for pod in pods:
        create_pod(core, namespace, pod.executor, pod.spec)
    for pod in pods:
        placed = wait_scheduled(core, namespace, pod.executor)
        assert placed.node in POOL_NODES[STAGE_POOL[pod.stage]], (
            f"{pod.stage} ({pod.executor}) should run on the {STAGE_POOL[pod.stage]} pool "
            f"{sorted(POOL_NODES[STAGE_POOL[pod.stage]])}, scheduler said: {placed.node or placed.reason}")
        gpus = pod.spec["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
        if gpus:
            assert placed.node != "cpu-0" and placed.node in GPU_NODES, f"GPU stage {pod.stage} on {placed.node}"


def _gpu_pod(compiled_pipelines, stage):
    _, pipeline = compiled_pipelines["offline"]
    return next(p for p in pipeline.stage_pods() if p.stage == stage)


@pytest.mark.parametrize(("stage", "break_it", "reason"), [
    ("train", lambda s: s["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "16"}),
     "Insufficient nvidia.com/gpu"),
    ("generate", lambda s: s["nodeSelector"].update({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
     "didn't match Pod's node affinity/selector"),
    ("extract", lambda s: s.pop("tolerations"), "untolerated taint"),
], ids=["more-gpus-than-a-node", "label-no-node-carries", "no-gpu-toleration"])
def test_impossible_placement_gets_the_schedulers_reason(k8s, kube_api, namespace, compiled_pipelines, stage,
                                                         break_it, reason):
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    spec = copy.deepcopy(_gpu_pod(compiled_pipelines, stage).spec)
    break_it(spec)
    create_pod(core, namespace, "impossible", spec)
    placed = wait_scheduled(core, namespace, "impossible")
    assert placed.node is None, f"scheduled onto {placed.node}"
    assert reason in placed.reason and f"0/{len(FAKE_NODES)} nodes are available" in placed.reason, placed.reason

