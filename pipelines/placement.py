"""Where and how each stage's pod runs on Kubernetes: node pool, GPUs, requests, /dev/shm, retries, timeouts, secrets.

Node selectors, tolerations and GPU counts are pipeline parameters (defaults from the compile-time config's pools),
so an operator can move a stage to another pool from the Kubeflow UI. That is why the `_json` variants are used:
plain `add_node_selector` rejects a parameter. kfp.local ignores all of this; tests read the compiled spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kfp import kubernetes

from flashdraft.config import PoolConfig

# Stages with GPU work: preemptible nodes, so retry with backoff (every stage resumes from committed work).
GPU_STAGES = ("generate", "extract", "train", "evaluate")
# Stages that run vLLM or torchrun and need a real /dev/shm (the pod default is 64 MiB).
SHM_STAGES = ("generate", "extract", "train", "evaluate")
RETRIES = {"num_retries": 3, "backoff_duration": "120s", "backoff_factor": 2.0, "backoff_max_duration": "3600s"}
# Wall-clock limits per stage pod (activeDeadlineSeconds); generous: a 27B target shard can take hours.
TIMEOUT_S = {
    "plan": 900, "prep": 4 * 3600, "generate": 24 * 3600, "extract": 24 * 3600, "train": 7 * 24 * 3600,
    "evaluate": 6 * 3600, "export": 3600, "report": 1800, "train-launcher": 7 * 24 * 3600,
    "stream-end": 900,
}
# Keys of the Kubernetes Secret (created by the Helm chart) mapped to the env names boto3/s3fs read.
S3_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}


@dataclass(frozen=True)
class PoolParams:
    """The pipeline parameters (channels at definition time) that place one pool's pods."""

    node_selector: Any
    tolerations: Any
    gpus: Any  # None for the CPU pool


def place(task: Any, stage: str, pool: PoolConfig, params: PoolParams, s3_secret_name: Any,
          retries: bool = True) -> Any:
    """Apply every Kubernetes setting for `stage` to `task`; returns the task. `retries=False` for kfp.local
    (which honours retries and their backoff, but a local failure is not a preemption: fail fast)."""
    kubernetes.add_node_selector_json(task, params.node_selector)
    kubernetes.add_toleration_json(task, params.tolerations)
    task.set_cpu_request(pool.cpu_request).set_memory_request(pool.memory_request)
    if pool.accelerator_type and params.gpus is not None:
        task.set_accelerator_type(pool.accelerator_type).set_accelerator_limit(params.gpus)
    if stage in SHM_STAGES:
        kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory",
                                   size_limit=pool.shm_size)
    if retries and stage in GPU_STAGES:
        task.set_retry(**RETRIES)
    kubernetes.set_timeout(task, TIMEOUT_S[stage])
    # Every stage writes to the object store outside KFP's view; a cache hit would skip real work.
    task.set_caching_options(enable_caching=False)
    kubernetes.use_secret_as_env(task, secret_name=s3_secret_name, secret_key_to_env=S3_SECRET_KEYS)
    return task
