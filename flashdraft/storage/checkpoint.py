"""Training checkpoints in the object store: safetensors + JSON, never pickle.

Layout under `checkpoints/`:

    step-00000100/drafter_config.json     the drafter geometry (drafter.persistence.load_drafter reads this folder)
    step-00000100/model.safetensors       trainable weights (z-lab names)
    step-00000100/optimizer.safetensors   optimizer state tensors, keyed "<param fqn>/<name>" (AdamW: exp_avg,
                                          exp_avg_sq, step; Muon: momentum_buffer)
    step-00000100/optimizer.json          param groups of every optimizer (hyper-parameters and fqn order)
    step-00000100/trainer_state.json      step, data position, lr schedule, metrics so far
    step-00000100/rng-rank-00000.safetensors  per-rank torch (and CUDA) RNG states
    step-00000100/state-rank-00000.json   per-rank extra state (streaming: the reader's stream position)
    latest.json                           {"step", "prefix", "final"}: committed last, so it only ever names a
                                          checkpoint whose every file is committed

Full (unsharded) state dicts come from `torch.distributed.checkpoint.state_dict`, which works the same for a
plain module, DDP and FSDP2 (gathered to rank 0 on save, broadcast from rank 0 on load).
"""

from __future__ import annotations

from typing import Any

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from flashdraft.storage import layout
from flashdraft.storage.layout import CONFIG_FILE, WEIGHTS_FILE
from flashdraft.storage.store import ObjectStore

TUPLE_HYPERPARAMETERS = ("betas", "ns_coefficients")  # AdamW's and Muon's tuples, lists in JSON
Optimizers = torch.optim.Optimizer | list[torch.optim.Optimizer]  # several: one state dict over all of them


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rank() -> int:
    return torch.distributed.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        torch.distributed.barrier()


def _flatten_optimizer(osd: dict) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    for fqn, state in osd["state"].items():
        for name, value in state.items():
            t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"{fqn}/{name}"] = t.detach().cpu().contiguous()
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in osd["param_groups"]]
    return tensors, {"param_groups": groups}


def _load_in_order(data: bytes) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors in sorted key order. `safetensors.torch.load` returns them in an order that
    differs between processes, and under FSDP2 `set_model_state_dict` / `set_optimizer_state_dict` scatter each
    full tensor to its shards in the dict's order: every rank must walk the keys in the same order, or the
    scatters pair up different tensors (gloo: "Received data size doesn't match expected size")."""
    tensors = load_bytes(data)
    return {k: tensors[k] for k in sorted(tensors)}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict:
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        fqn, name = key.rsplit("/", 1)
        state.setdefault(fqn, {})[name] = t
    groups = [{k: (tuple(v) if k in TUPLE_HYPERPARAMETERS else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def _rng_state() -> dict[str, torch.Tensor]:
    out = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def save_checkpoint(store: ObjectStore, model: torch.nn.Module, optimizer: Optimizers,
                    drafter_config: dict, trainer_state: dict, *, final: bool = False,
                    rank_state: dict | None = None) -> str:
    """Collective: every rank calls it. Rank 0 writes model/optimizer/state, each rank its RNG state (and its
    `rank_state`, e.g. its streaming reader position), then rank 0 commits latest.json after a barrier."""
    step = int(trainer_state["step"])
    prefix = layout.checkpoint_prefix(step)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    rank = _rank()
    # One full state dict at a time (weights, then optimizer state), each serialised, committed and dropped
    # before the next is gathered: rank 0 holds the full fp32 copy of one of them, not of both (at 5120 wide a
    # one-layer drafter's weights are 1.8 GB and its AdamW state 3.6 GB, each again as serialised bytes).
    msd = get_model_state_dict(model, options=opts)
    if rank == 0:
        weights = {k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().contiguous()
                   for k, v in msd.items()}  # integer buffers (the draft vocabulary's d2t) stay integers
        store.commit(f"{prefix}/{WEIGHTS_FILE}", save_bytes(weights))
        del weights
    del msd
    osd = get_optimizer_state_dict(model, optimizer, options=opts)
    if rank == 0:
        opt_tensors, opt_meta = _flatten_optimizer(osd)
        del osd
        store.commit(f"{prefix}/optimizer.safetensors", save_bytes(opt_tensors))
        del opt_tensors
        store.commit_json(f"{prefix}/optimizer.json", opt_meta)
        store.commit_json(f"{prefix}/{CONFIG_FILE}", drafter_config)
        store.commit_json(f"{prefix}/trainer_state.json", trainer_state)
    else:
        del osd
    store.commit(f"{prefix}/rng-rank-{rank:05d}.safetensors", save_bytes(_rng_state()))
    if rank_state is not None:
        store.commit_json(rank_state_key(prefix, rank), rank_state)
    _barrier()
    if rank == 0:
        store.commit_json(layout.CHECKPOINT_LATEST, {"step": step, "prefix": prefix, "final": final})
    _barrier()
    return prefix


def rank_state_key(prefix: str, rank: int) -> str:
    return f"{prefix}/state-rank-{rank:05d}.json"


def load_rank_state(store: ObjectStore, prefix: str) -> dict | None:
    """This rank's `rank_state` from the checkpoint at `prefix`, or None (none saved, or another world size)."""
    key = rank_state_key(prefix, _rank())
    return store.get_json_verified(key) if store.is_committed(key) else None


def latest_checkpoint(store: ObjectStore) -> dict | None:
    return store.get_json_verified(layout.CHECKPOINT_LATEST) if store.is_committed(layout.CHECKPOINT_LATEST) else None


def load_checkpoint(store: ObjectStore, prefix: str, model: torch.nn.Module,
                    optimizer: Optimizers) -> dict:
    """Restore model, optimizer and this rank's RNG; returns trainer_state. Checksums are verified."""
    opts = StateDictOptions(full_state_dict=True, strict=True)
    set_model_state_dict(model, _load_in_order(store.get_verified(f"{prefix}/{WEIGHTS_FILE}")), options=opts)
    osd = _unflatten_optimizer(_load_in_order(store.get_verified(f"{prefix}/optimizer.safetensors")),
                               store.get_json_verified(f"{prefix}/optimizer.json"))
    set_optimizer_state_dict(model, optimizer, osd, options=opts)
    del osd  # one full copy at a time, as on save
    rng_key = f"{prefix}/rng-rank-{_rank():05d}.safetensors"
    if store.is_committed(rng_key):
        rng = load_bytes(store.get_verified(rng_key))
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return store.get_json_verified(f"{prefix}/trainer_state.json")

