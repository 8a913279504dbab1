"""The process group a training run lives in: torchrun's environment, one all-reduce helper, DDP / FSDP2 wrapping.

Every collective here is a no-op in a single process, so the same trainer code runs with and without torchrun.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from flashdraft.config import TrainingConfig


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        """Several ranks, or one rank that torchrun launched (a one-GPU FSDP2 run keeps the process group and the
        sharded wrappers, so it runs the code a multi-GPU run does)."""
        return self.world_size > 1 or (dist.is_available() and dist.is_initialized())


def setup_distributed() -> DistEnv:
    """Read the torchrun environment; NCCL on CUDA, gloo on CPU (a process group whenever torchrun launched us)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    launched = world > 1 or "TORCHELASTIC_RUN_ID" in os.environ  # torchrun sets it, even for one rank
    if launched and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return DistEnv(rank, world, local, device)


def all_reduce(t: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    """`t` reduced in place over the process group (untouched without one)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=op)
    return t


def wrap_model(model: torch.nn.Module, training: TrainingConfig, env: DistEnv) -> torch.nn.Module:
    """DDP (default) or FSDP2 (`fully_shard` per layer) over the process group; the bare model in one process."""
    if not env.distributed:
        return model
    if training.strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        if getattr(model, "candidate_selector", None) is not None:  # DFlash2: called outside the model's forward
            fully_shard(model.candidate_selector)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None,
                                   broadcast_buffers=False)
