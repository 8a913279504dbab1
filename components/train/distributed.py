"""The process group a training run lives in: torchrun's environment, one all-reduce helper, DDP / FSDP2 wrapping.

Every collective here is a no-op in a single process, so the same trainer code runs with and without torchrun.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def from_rank0(compute: Callable[[], Any]) -> Any:
    """`compute()` run on rank 0 only and its JSON-able result broadcast to every rank, so all ranks work from
    one answer (the offline part list: ranks that list a store differently would train epochs of different
    lengths and hang in a collective). An error on rank 0 is raised there as is and on every other rank as
    RankZeroError with its message, so no rank waits for a broadcast that never comes. Sent as JSON bytes in a
    tensor (no pickle); without a process group, just `compute()`."""
    if not (dist.is_available() and dist.is_initialized()):
        return compute()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    failure: Exception | None = None
    payload = b""
    if dist.get_rank() == 0:
        try:
            payload = json.dumps({"value": compute()}).encode()
        except Exception as exc:  # noqa: BLE001 - sent to the other ranks, then raised here
            failure, payload = exc, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
    size = torch.tensor([len(payload)], dtype=torch.long, device=device)
    dist.broadcast(size, 0)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device) if payload else \
        torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, 0)
    if failure is not None:
        raise failure
    message = json.loads(bytes(data.cpu().tolist()))
    if "error" in message:
        raise RankZeroError(f"rank 0: {message['error']}")
    return message["value"]


class RankZeroError(RuntimeError):
    """What rank 0 raised computing a value every rank needed (its type and message)."""


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
