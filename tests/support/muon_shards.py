"""Two gloo ranks train the same two Linear layers, FSDP2-sharded (13 rows: uneven shards), with
`WholeMatrixMuon`, beside an unsharded copy with the same optimizer (on CPU both run the fp32 Newton-Schulz);
prints each weight's largest difference after three steps as JSON (rank 0)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard

from flashdraft.components.train.optim import WholeMatrixMuon


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 13, bias=False), torch.nn.Linear(13, 6, bias=False))


def _rank(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ref, sharded = _model(), _model()
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    hyper = dict(lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    opts = [WholeMatrixMuon(ref.parameters(), **hyper), WholeMatrixMuon(sharded.parameters(), **hyper)]
    for step in range(3):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step))
        for model, opt in zip((ref, sharded), opts, strict=True):
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
    diffs = {n: float((p.full_tensor() - q).abs().max()) for (n, p), q in zip(sharded.named_parameters(),
                                                                               ref.parameters(), strict=True)}
    if rank == 0:
        print(json.dumps(diffs), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_rank, args=(2, int(sys.argv[1])), nprocs=2)
