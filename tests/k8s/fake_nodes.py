"""The k8s tier's fake nodes (tests/k8s/conftest.py registers them with the control plane): shaped like the two GPU
pools of the `qwen3.6-27b` preset plus a CPU node."""

from __future__ import annotations

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _gpu_labels(product: str, memory_mib: int, count: int) -> dict[str, str]:
    """What the NVIDIA GPU operator's feature discovery puts on a GPU node (the labels pools select on)."""
    return {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
            "nvidia.com/gpu.memory": str(memory_mib), "nvidia.com/gpu.family": "blackwell",
            "nvidia.com/gpu.deploy.device-plugin": "true"}


# The hardware, as the GPU operator labels it: written from the machines, never from flashdraft's config, so a
# wrong label in a preset or the chart makes a pod unschedulable here exactly as on a real cluster.
FAKE_NODES = {
    # Inference pool: 8x RTX PRO 6000 Blackwell Server Edition (96 GB), 2x 64-core CPUs, 1.5 TiB.
    "pro6000-0": {"labels": _gpu_labels("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", 97887, 8),
                  "gpus": 8, "cpu": "128", "memory": "1536Gi", "taints": [GPU_TAINT]},
    "pro6000-1": {"labels": _gpu_labels("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", 97887, 8),
                  "gpus": 8, "cpu": "128", "memory": "1536Gi", "taints": [GPU_TAINT]},
    # Trainer pool: B200 NVL8 (DGX B200: 8x 180 GB, 224 threads, 2 TiB).
    "b200-0": {"labels": _gpu_labels("NVIDIA-B200", 183359, 8), "gpus": 8, "cpu": "224", "memory": "2048Gi",
               "taints": [GPU_TAINT]},
    "b200-1": {"labels": _gpu_labels("NVIDIA-B200", 183359, 8), "gpus": 8, "cpu": "224", "memory": "2048Gi",
               "taints": [GPU_TAINT]},
    # A plain CPU node, no GPU labels, no taint; its node-pool label is the one ci/custom-pools-values.yaml selects.
    "cpu-0": {"labels": {"pool.example.com/name": "cpu-general"}, "gpus": 0, "cpu": "32", "memory": "128Gi",
              "taints": []},
}
POOL_NODES = {"inference": {"pro6000-0", "pro6000-1"}, "trainer": {"b200-0", "b200-1"}, "cpu": {"cpu-0"}}
