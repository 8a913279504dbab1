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
from flashdraft.pipelines.secret_env import HUB_SECRET_KEYS, S3_SECRET_KEYS, TRACKING_SECRET_KEYS
from flashdraft.run import registry

# The uid the images run as (docker/*/Dockerfile ARG APP_UID): pods pin it, so a policy can check it.
APP_UID = 10001
# The images' cache root (XDG_CACHE_HOME, HF_HOME, vLLM's and Triton's caches live under it).
CACHE_DIR = "/cache"
RETRIES = {"num_retries": 3, "backoff_duration": "120s", "backoff_factor": 2.0, "backoff_max_duration": "3600s"}
# The multi-node training launcher is a pipeline task, not a stage: it waits as long as training may run.
LAUNCHER = "train-launcher"


def timeout_s(task_name: str) -> int:
    """Wall-clock limit of a task's pod (activeDeadlineSeconds): the stage's declared timeout."""
    return registry.current().get("train" if task_name == LAUNCHER else task_name).timeout_s


@dataclass(frozen=True)
class PoolParams:
    """The pipeline parameters (channels at definition time) that place one pool's pods."""

    node_selector: Any
    tolerations: Any
    gpus: Any  # None for the CPU pool


@dataclass(frozen=True)
class SecretNames:
    """The pipeline parameters (channels) naming the Secrets every stage pod takes its env from
    (pipelines/secret_env.py): the S3 credentials (required), the trackers' settings and the Hub's token and
    endpoint (both optional)."""

    s3: Any
    tracking: Any
    hub: Any


def harden(task: Any, pool: PoolConfig) -> None:
    """What Kubernetes lets a pipeline task say about its own safety (kfp-kubernetes 2.17): the images' non-root
    uid, limits equal to the requests, and the caches on a size-limited volume.

    Limits = requests: a stage that outgrows its memory is OOM-killed in its own cgroup instead of pushing the
    node into memory pressure that evicts its neighbours (and the memory-backed /dev/shm counts inside it); the
    pools' requests are already what a stage needs. KFP 2.17's backend adds allowPrivilegeEscalation=false,
    capabilities drop ALL and seccomp RuntimeDefault to every task container by itself; a read-only root
    filesystem and an ephemeral-storage request it cannot express (docs/security.md says where a cluster sets
    them)."""
    kubernetes.set_security_context(task, run_as_user=APP_UID, run_as_group=APP_UID, run_as_non_root=True)
    task.set_cpu_limit(pool.cpu_request).set_memory_limit(pool.memory_request)
    kubernetes.empty_dir_mount(task, volume_name="cache", mount_path=CACHE_DIR,
                               size_limit=pool.ephemeral_storage_request)


def place(task: Any, stage: str, pool: PoolConfig, params: PoolParams, secrets: SecretNames,
          retries: bool = True) -> Any:
    """Apply every Kubernetes setting for `stage` to `task`; returns the task. `retries=False` for kfp.local
    (which honours retries and their backoff, but a local failure is not a preemption: fail fast)."""
    kubernetes.add_node_selector_json(task, params.node_selector)
    kubernetes.add_toleration_json(task, params.tolerations)
    task.set_cpu_request(pool.cpu_request).set_memory_request(pool.memory_request)
    harden(task, pool)
    gpu_pool = params.gpus is not None
    if pool.accelerator_type and gpu_pool:
        task.set_accelerator_type(pool.accelerator_type).set_accelerator_limit(params.gpus)
    if gpu_pool:  # vLLM and torchrun need a real /dev/shm (the pod default is 64 MiB)
        kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory",
                                   size_limit=pool.shm_size)
    if retries and gpu_pool:  # GPU pools are preemptible: retry with backoff (every stage resumes)
        task.set_retry(**RETRIES)
    kubernetes.set_timeout(task, timeout_s(stage))
    # Every stage writes to the object store outside KFP's view; a cache hit would skip real work.
    task.set_caching_options(enable_caching=False)
    kubernetes.use_secret_as_env(task, secret_name=secrets.s3, secret_key_to_env={k: k for k in S3_SECRET_KEYS})
    # optional: the pod starts without the Secret, or with only some of its keys (no tracker, or MLflow alone)
    kubernetes.use_secret_as_env(task, secret_name=secrets.tracking,
                                 secret_key_to_env={k: k for k in TRACKING_SECRET_KEYS}, optional=True)
    # optional: public repositories on the public Hub need no token, and no mirror means huggingface.co
    kubernetes.use_secret_as_env(task, secret_name=secrets.hub, secret_key_to_env={k: k for k in HUB_SECRET_KEYS},
                                 optional=True)
    return task
