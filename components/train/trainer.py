"""`run_train(cfg)`: train the DFlash drafter on committed feature shards, one process or one torchrun rank.

* Data: `flashdraft.features.reader` (disjoint per rank, deterministic order per (seed, epoch), provenance
  checked). Offline: rows are packed greedily by length to `training.tokens_per_step` tokens (`group_sizes`), so
  every rank knows its micro-batch count per epoch without reading data; ranks agree on the minimum. Streaming
  (`mode.kind=streaming`): the reader's follow mode, packed on the fly, ranks stop together when one runs dry.
* Step: `grad_accum` micro-batches, each normalised on its own (see drafter/loss.py), averaged; AdamW, cosine
  with `warmup_ratio` warmup, grad-norm clip; bf16 autocast on CUDA. DDP by default, FSDP2 (`fully_shard` per
  layer) with `training.strategy=fsdp2`.
* Checkpoints (flashdraft/checkpoint.py) every `checkpoint_every` optimizer steps and at the end. The
  data position is (epoch, micro-batches done in it), or in streaming mode each rank's stream position (the
  reader releases a part from the window only once a checkpoint covers it); anchors are a pure function of
  (seed, epoch, sample), so an interrupted + resumed run reproduces an uninterrupted one in both modes.
* Metrics: per step loss, lr, grad norm, tokens/s, and loss/accuracy per block position, committed as
  `metrics/train.json` for the report.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from flashdraft import layout
from flashdraft.config import RunConfig
from flashdraft.drafter.batch import group_sizes, pack, token_budget_groups
from flashdraft.drafter.loss import dflash_loss
from flashdraft.drafter.vocab import count_response_tokens, draft_labels, top_tokens
from flashdraft.store import io_counters, open_store

log = logging.getLogger(__name__)


class TrainError(RuntimeError):
    """Training cannot start or continue; the message says why and what to change."""


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup_distributed() -> DistEnv:
    """Read the torchrun environment; NCCL on CUDA, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return DistEnv(rank, world, local, device)


def lr_at(step: int, total: int, cfg: RunConfig) -> float:
    """Linear warmup over ceil(warmup_ratio * total) steps, then cosine to 0 (or constant)."""
    t = cfg.training
    warm = math.ceil(total * t.warmup_ratio) if t.warmup_ratio > 0 else 0
    if step < warm:
        return t.lr * (step + 1) / warm
    if t.schedule == "constant":
        return t.lr
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return t.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def _all_reduce(t: torch.Tensor, op=None) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


def wrap_model(model: torch.nn.Module, cfg: RunConfig, env: DistEnv) -> torch.nn.Module:
    if not env.distributed:
        return model
    if cfg.training.strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None,
                                   broadcast_buffers=False)


def build_model(cfg: RunConfig, env: DistEnv):
    from flashdraft.drafter.model import build_drafter
    from flashdraft.target import load_hf_config

    model = build_drafter(cfg, load_hf_config(cfg.target), seed=cfg.training.seed, device=env.device)
    head = cfg.drafter.head_dtype
    if head == "bfloat16" or (head == "auto" and env.device.type == "cuda"):
        # frozen vocab-sized tensors in bf16: half the memory, bf16 logits GEMMs (fp32 accumulate, fp32 softmax)
        model.set_frozen(model.embed_weight.bfloat16(), model.lm_head_weight.bfloat16())
    return model


def drafter_loss(raw, hidden: torch.Tensor, batch, cfg: RunConfig):
    """The DFlash loss over the drafter's head: the target's LM head, or its draft-vocabulary rows with labels
    mapped to draft indices (slots whose label is outside the draft vocabulary drop out)."""
    labels, valid = batch.labels, batch.valid
    if raw.d2t is not None:
        labels, valid = draft_labels(labels, valid, raw.target_to_draft())
    return dflash_loss(hidden, raw.head_weight, labels, valid, cfg.drafter.resolved_gamma,
                       cfg.drafter.loss_normalization)


def build_draft_vocab(raw, reader, cfg: RunConfig) -> None:
    """Pick the draft vocabulary from the response tokens of this run's data (counts summed over ranks)."""
    if cfg.mode.kind == "streaming":
        raise TrainError("drafter.draft_vocab_size needs the data up front: use mode.kind=offline, or unset it")
    counts = _all_reduce(count_response_tokens((vars(s) for s in reader), raw.geometry.vocab_size))
    raw.set_draft_vocab(top_tokens(counts, raw.geometry.draft_vocab_size))
    covered = float(counts[raw.d2t.cpu()].sum()) / max(1, int(counts.sum()))
    log.info("draft vocabulary: %d of %d tokens, covering %.2f%% of response tokens", raw.d2t.numel(),
             raw.geometry.vocab_size, 100 * covered)


def _stats_len(block_size: int) -> int:
    return 3 + 3 * (block_size - 1)  # loss, tokens, anchors | ce_sum, correct, count per slot


def micro_step(model, raw, samples: list[dict], cfg: RunConfig, epoch: int, env: DistEnv, scale: float,
               stats: torch.Tensor, sync: bool) -> None:
    """Forward + backward of one packed row; adds its statistics into `stats`."""
    d = cfg.drafter
    batch = pack(samples, d.block_size, d.max_anchors, seed=cfg.training.seed, epoch=epoch,
                 max_tokens=cfg.training.tokens_per_step).to(env.device)
    no_sync = getattr(model, "no_sync", None)
    ctx = no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()
    with ctx:
        if batch.anchors.numel() == 0:  # nothing to learn here; still touch every parameter so DDP stays in step
            loss = sum(p.sum() for p in model.parameters()) * 0.0
            loss.backward()
            stats[1] += batch.num_tokens
            return
        with torch.autocast(env.device.type, dtype=torch.bfloat16, enabled=env.device.type == "cuda"):
            hidden = model(*batch.drafter_inputs())
        out = drafter_loss(raw, hidden, batch, cfg)
        (out.loss * scale).backward()
    B1 = d.block_size - 1
    stats[0] += float(out.loss.detach()) * scale
    stats[1] += batch.num_tokens
    stats[2] += batch.anchors.numel()
    stats[3:3 + B1] += out.ce_sum.float().cpu()
    stats[3 + B1:3 + 2 * B1] += out.correct.float().cpu()
    stats[3 + 2 * B1:] += out.count.float().cpu()


def _summarise(stats: torch.Tensor, block_size: int, world: int) -> dict:
    B1 = block_size - 1
    ce, correct, count = stats[3:3 + B1], stats[3 + B1:3 + 2 * B1], stats[3 + 2 * B1:]
    safe = count.clamp_min(1)
    return {"loss": round(float(stats[0]) / world, 6), "tokens": int(stats[1]), "anchors": int(stats[2]),
            "ce_by_pos": [round(float(x), 5) for x in ce / safe],
            "acc_by_pos": [round(float(x), 5) for x in correct / safe],
            "acc": round(float(correct.sum() / count.sum().clamp_min(1)), 5)}


class OfflinePlan:
    """Per-epoch row sizes from shard headers only; ranks agree on the smallest micro-batch count."""

    def __init__(self, reader, cfg: RunConfig):
        t = cfg.training
        self.sizes: list[list[int]] = []
        for epoch in range(t.epochs):
            order = reader.worker_order(epoch)
            lengths = [reader.header(k).samples[i].num_tokens for k, i in order]
            self.sizes.append(group_sizes(lengths, t.tokens_per_step))
        counts = torch.tensor([len(s) for s in self.sizes], dtype=torch.long)
        counts = _all_reduce(counts, dist.ReduceOp.MIN if dist.is_initialized() else None)
        self.steps_per_epoch = [int(c) // t.grad_accum for c in counts]
        if sum(self.steps_per_epoch) == 0:
            raise TrainError(f"not enough feature data for one optimizer step: {counts.tolist()} rows per epoch on "
                             f"the smallest rank, training.grad_accum={t.grad_accum}; extract more samples or lower "
                             f"training.tokens_per_step / grad_accum")
        total = sum(self.steps_per_epoch)
        self.total_steps = min(total, t.max_steps) if t.max_steps else total

    def epoch_of(self, step: int) -> tuple[int, int]:
        """(epoch, micro-batches already done in it) at optimizer step `step`."""
        for epoch, n in enumerate(self.steps_per_epoch):
            if step < n:
                return epoch, step
            step -= n
        return len(self.steps_per_epoch), 0


def offline_groups(reader, plan: OfflinePlan, cfg: RunConfig, start_step: int) -> Iterator[tuple[int, list[dict]]]:
    accum = cfg.training.grad_accum
    epoch, steps_done = plan.epoch_of(start_step)
    while epoch < len(plan.steps_per_epoch):
        sizes = plan.sizes[epoch][: plan.steps_per_epoch[epoch] * accum]
        first = steps_done * accum
        reader.load_state_dict({"seed": reader.seed, "epoch": epoch, "consumed": sum(sizes[:first])})
        it = iter(reader)
        try:
            for n in sizes[first:]:
                yield epoch, [vars(next(it)) for _ in range(n)]
        finally:
            it.close()
        epoch, steps_done = epoch + 1, 0


def streaming_groups(reader, cfg: RunConfig, env: DistEnv) -> Iterator[tuple[int, list[dict]]]:
    for group in token_budget_groups((vars(s) for s in reader), cfg.training.tokens_per_step):
        flag = _all_reduce(torch.ones(1), dist.ReduceOp.MIN if env.distributed else None)
        if flag.item() == 0:
            return
        yield 0, group
    _all_reduce(torch.zeros(1), dist.ReduceOp.MIN if env.distributed else None)  # tell the others we are done


def streaming_total_steps(cfg: RunConfig) -> int:
    if cfg.training.max_steps:
        return cfg.training.max_steps
    samples = cfg.data.expected_samples or cfg.data.max_samples
    if not samples:
        raise TrainError("streaming mode needs training.max_steps, or data.expected_samples to size the schedule")
    tokens = samples * cfg.data.expected_tokens_per_sample * cfg.mode.reuse
    return max(1, tokens // (cfg.training.tokens_per_step * cfg.training.grad_accum * cfg.training.world_size))


def run_train(cfg: RunConfig, *, stop_after: int | None = None) -> dict:
    """Train (or resume) and return the JSON summary. `stop_after` ends the process's work after that many
    optimizer steps without a final checkpoint (simulated preemption for tests)."""
    from tqdm import tqdm

    from flashdraft.checkpoint import (
        latest_checkpoint,
        load_checkpoint,
        load_rank_state,
        save_checkpoint,
    )
    from flashdraft.features.reader import open_reader
    from flashdraft.target import set_cpu_threads

    env = setup_distributed()
    set_cpu_threads(cfg, env.device.type)
    io0 = io_counters()
    store = open_store(cfg.storage, cfg.run_id)
    latest = latest_checkpoint(store)
    if latest and latest["final"] and store.is_committed(layout.metrics_key("train")):
        log.info("training already finished at step %d: nothing to do", latest["step"])
        return {**store.get_json_verified(layout.metrics_key("train")), "skipped": True}

    torch.manual_seed(cfg.training.seed)
    raw = build_model(cfg, env)
    model = wrap_model(raw, cfg, env)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.training.lr, weight_decay=cfg.training.weight_decay)
    streaming = cfg.mode.kind == "streaming"
    reader = open_reader(cfg, rank=env.rank, world_size=env.world_size, defer_release=streaming)
    plan = None if streaming else OfflinePlan(reader, cfg)
    total = streaming_total_steps(cfg) if streaming else plan.total_steps

    state = {"step": 0, "history": [], "train_seconds": 0.0, "tokens": 0}
    position = 0  # streaming: samples this rank has trained on since the stream began
    if raw.d2t is not None and not latest:  # a resumed run gets its vocabulary back with the weights
        build_draft_vocab(raw, reader, cfg)
    if latest:
        state = load_checkpoint(store, latest["prefix"], model, optimizer)
        if raw.d2t is not None:
            raw.refresh_head()
        log.info("resumed from %s (step %d)", latest["prefix"], state["step"])
        stream = load_rank_state(store, latest["prefix"]) if streaming else None
        if stream is not None:
            reader.resume_follow(stream)
            position = int(stream["position"])
        elif streaming:
            log.warning("streaming resume without a saved stream position for this rank (saved with another "
                        "world size?): the reader restarts at the first part still in the window")
    step = int(state["step"])
    drafter_config = raw.config_dict()
    groups = streaming_groups(reader, cfg, env) if streaming else offline_groups(reader, plan, cfg, step)

    def checkpoint(final: bool = False) -> str:
        """Save; in streaming mode with this rank's stream position, then release the parts it covers."""
        rank_state = reader.follow_state(position) if streaming else None
        prefix = save_checkpoint(store, model, optimizer, drafter_config, state, final=final, rank_state=rank_state)
        if streaming:  # at the end, every part taken up is done with, trained on or not (max_steps)
            reader.release_through(sys.maxsize if final else position)
        return prefix

    accum, B = cfg.training.grad_accum, cfg.drafter.block_size
    bar = tqdm(total=total, initial=step, unit="step", desc="train", disable=env.rank != 0 or None)
    if env.rank == 0:
        log.info("training %d trainable params, %d optimizer steps, world size %d, strategy %s, device %s",
                 sum(p.numel() for p in params), total, env.world_size, cfg.training.strategy, env.device)
    model.train()
    stopped = False
    t_step = time.perf_counter()
    stats = torch.zeros(_stats_len(B))
    micro, epoch = 0, 0
    for epoch, samples in groups:
        if step >= total:
            break
        micro += 1
        micro_step(model, raw, samples, cfg, epoch, env, 1.0 / accum, stats, sync=micro == accum)
        position += len(samples)
        if micro < accum:
            continue
        micro = 0
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.training.grad_clip)
        lr = lr_at(step, total, cfg)
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        _all_reduce(stats)
        elapsed = time.perf_counter() - t_step
        entry = {"step": step, "epoch": epoch, "lr": lr, "grad_norm": round(float(grad_norm), 5),
                 **_summarise(stats, B, env.world_size), "step_s": round(elapsed, 4)}
        entry["tokens_per_s"] = round(entry["tokens"] / elapsed, 1)
        state["history"].append(entry)
        state["train_seconds"] += elapsed
        state["tokens"] += entry["tokens"]
        stats.zero_()
        bar.update(1)
        bar.set_postfix(loss=f"{entry['loss']:.3f}", acc1=f"{entry['acc_by_pos'][0]:.3f}", lr=f"{lr:.2e}",
                        tok_s=f"{entry['tokens_per_s']:.0f}")
        data_pos = {"epoch": epoch, "step_in_epoch": plan.epoch_of(step)[1] if plan else None}
        state.update(step=step, total_steps=total, data_position=data_pos)
        if step % cfg.training.checkpoint_every == 0 and step < total:
            checkpoint()
        if stop_after is not None and step >= stop_after and step < total:
            stopped = True
            break
        t_step = time.perf_counter()
    bar.close()
    if stopped:
        return {"stopped_at": step, "total_steps": total}
    if step == 0:
        raise TrainError("no training data arrived (streaming reader ended before one optimizer step)")
    state.update(step=step, total_steps=step)
    prefix = checkpoint(final=True)
    summary = train_summary(cfg, state, prefix, env, raw)
    summary["store_io"] = io_counters(io0)  # this rank's (rank 0's) store operations and retries
    if env.rank == 0:
        store.commit_json(layout.metrics_key("train"), summary)
        log.info("trained %d steps: loss %.4f, slot-1 acc %.3f, %.0f tokens/s; checkpoint %s", step,
                 summary["final"]["loss"], summary["final"]["acc_by_pos"][0], summary["tokens_per_s"], prefix)
    return summary


def train_summary(cfg: RunConfig, state: dict, prefix: str, env: DistEnv, raw) -> dict:
    hist = state["history"]
    tail = hist[-max(1, len(hist) // 10):]  # the last 10% of steps: a less noisy "final" value
    B1 = cfg.drafter.block_size - 1
    final = {"loss": sum(h["loss"] for h in tail) / len(tail),
             "acc_by_pos": [sum(h["acc_by_pos"][k] for h in tail) / len(tail) for k in range(B1)],
             "ce_by_pos": [sum(h["ce_by_pos"][k] for h in tail) / len(tail) for k in range(B1)]}
    secs = max(state["train_seconds"], 1e-9)
    return {"steps": state["step"], "world_size": env.world_size, "strategy": cfg.training.strategy,
            "device": str(env.device), "checkpoint": prefix, "tokens": state["tokens"],
            "train_seconds": round(secs, 3), "tokens_per_s": round(state["tokens"] / secs, 1),
            "trainable_params": sum(p.numel() for p in raw.parameters() if p.requires_grad),
            "block_size": cfg.drafter.block_size, "gamma": cfg.drafter.resolved_gamma,
            "loss_normalization": cfg.drafter.loss_normalization, "mask_token_id": raw.geometry.mask_token_id,
            "trainable_mask": raw.geometry.trainable_mask, "final": final, "history": hist}


@torch.no_grad()
def evaluate_samples(model, samples: list[dict], cfg: RunConfig, epoch: int = 0) -> dict:
    """Loss and per-position accuracy of `model` (a DFlashDrafter) on held-out samples, one row per sample."""
    d = cfg.drafter
    stats = torch.zeros(_stats_len(d.block_size))
    dev = next(model.parameters()).device
    model.eval()
    n = 0
    for s in samples:
        batch = pack([s], d.block_size, d.max_anchors, seed=cfg.training.seed, epoch=epoch).to(dev)
        if batch.anchors.numel() == 0:
            continue
        out = drafter_loss(model, model(*batch.drafter_inputs()), batch, cfg)
        B1 = d.block_size - 1
        stats[0] += float(out.loss)
        stats[3:3 + B1] += out.ce_sum.float().cpu()
        stats[3 + B1:3 + 2 * B1] += out.correct.float().cpu()
        stats[3 + 2 * B1:] += out.count.float().cpu()
        n += 1
    summary = _summarise(stats, d.block_size, max(n, 1))
    return summary
