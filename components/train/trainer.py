"""`run_train(cfg)`: train the DFlash drafter on committed feature shards, one process or one torchrun rank.

* Data (schedule.py): `flashdraft.features.reader`, disjoint per rank. Offline: rows packed greedily by length to
  `training.tokens_per_step` tokens (`group_sizes`), so every rank knows its micro-batch count per epoch without
  reading data (ranks agree on the minimum). Streaming: the reader's follow mode, packed on the fly; ranks stop
  together when one runs dry.
* Step (`Trainer.step`): `grad_accum` micro-batches, each normalised on its own, averaged; AdamW or Muon + AdamW
  (optim.py), cosine warmup,
  grad-norm clip, bf16 autocast on CUDA; DDP, or FSDP2 with `training.strategy=fsdp2` (distributed.py).
* Checkpoints (flashdraft/storage/checkpoint.py) every `checkpoint_every` steps and at the end, with the data position
  (epoch and micro-batches done, or each rank's stream position); anchors are a pure function of (seed, epoch,
  sample), so an interrupted + resumed run reproduces an uninterrupted one.
* Metrics (stats.py, heldout.py): per step loss, lr, grad norm, tokens/s, loss/accuracy per block position, and the
  held-out curve, committed as `metrics/train.json`. Recipe and measurements: docs/training.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterable, Iterator

import torch
from tqdm import tqdm

from flashdraft.components.train.distributed import DistEnv, all_reduce, setup_distributed, wrap_model
from flashdraft.components.train.heldout import HeldOutProbe
from flashdraft.components.train.optim import build_optimizers
from flashdraft.components.train.schedule import MicroBatch, TrainError, build_schedule
from flashdraft.components.train.state import TrainState
from flashdraft.components.train.stats import StepStats
from flashdraft.components.train.summary import FinalTrainStats, TrainSummary
from flashdraft.config import DrafterConfig, RunConfig
from flashdraft.drafter.batch import PackedBatch, pack
from flashdraft.drafter.dflash2 import selector_loss, selector_scale
from flashdraft.drafter.identity import ParentIdentity
from flashdraft.drafter.loss import LossOutput, dflash_loss
from flashdraft.drafter.vocab import count_response_tokens, draft_labels, top_tokens
from flashdraft.features.shard import Sample
from flashdraft.storage import layout
from flashdraft.storage.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from flashdraft.storage.store import io_counters, open_store
from flashdraft.tracking import Tracker, open_tracker

log = logging.getLogger(__name__)


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


def build_model(cfg: RunConfig, env: DistEnv):
    from flashdraft.drafter.persistence import build_drafter
    from flashdraft.target.model import resolve_target

    head = cfg.drafter.head_dtype
    bf16 = head == "bfloat16" or (head == "auto" and env.device.type == "cuda")
    # frozen vocab-sized tensors in bf16: half the memory, bf16 logits GEMMs on CUDA (fp32 accumulate, fp32
    # softmax); from a bf16 target checkpoint they stay memory-mapped, one copy shared by every rank on the node
    model = build_drafter(cfg, resolve_target(cfg).hf_config(), seed=cfg.training.seed, device=env.device,
                          frozen_dtype=torch.bfloat16 if bf16 else torch.float32)
    model.set_activation_checkpointing(cfg.training.activation_checkpointing)
    return model


def drafter_loss(raw, hidden: torch.Tensor, batch: PackedBatch, drafter: DrafterConfig,
                 selector_weight: float | None = None) -> LossOutput:
    """The DFlash loss over the drafter's head: the target's LM head, or its draft-vocabulary rows with labels
    mapped to draft indices (slots whose label is outside the draft vocabulary drop out). DFlash2 adds
    `selector_weight` (default drafter.selector_weight) times the selector loss over the same valid slots."""
    labels, valid = batch.labels, batch.valid
    if raw.d2t is not None:
        labels, valid = draft_labels(labels, valid, raw.target_to_draft())
    selector = raw.candidate_selector
    out = dflash_loss(hidden, raw.head_weight, labels, valid, drafter.resolved_gamma, drafter.loss_normalization,
                      top_k=selector.top_k if selector is not None else 0, weighting=drafter.loss_weights,
                      dpace_alpha=drafter.dpace_alpha)
    if selector is None:
        return out
    B = batch.block_size
    previous = batch.input_ids[batch.anchors[:, None] + torch.arange(B - 1, device=labels.device)]
    out.selector = selector_loss(selector, hidden[:, 1:].reshape(-1, hidden.shape[-1])[out.rows],
                                 raw.head_weight, out.top_ids, labels.reshape(-1)[out.rows],
                                 previous.reshape(-1)[out.rows], out.row_weight, drafter.selector_objective,
                                 drafter.selector_detach)
    weight = drafter.selector_weight if selector_weight is None else selector_weight
    out.loss = out.loss + weight * out.selector.loss  # also at weight 0: every parameter joins the graph (DDP)
    return out


def build_draft_vocab(raw, samples: Iterable[Sample]) -> None:
    """Pick the draft vocabulary from the response tokens of this run's data (counts summed over ranks)."""
    counts = all_reduce(count_response_tokens((vars(s) for s in samples), raw.geometry.vocab_size))
    raw.set_draft_vocab(top_tokens(counts, raw.geometry.draft_vocab_size))
    covered = float(counts[raw.d2t.cpu()].sum()) / max(1, int(counts.sum()))
    log.info("draft vocabulary: %d of %d tokens, covering %.2f%% of response tokens", raw.d2t.numel(),
             raw.geometry.vocab_size, 100 * covered)


def micro_step(model, raw, samples: list[Sample], cfg: RunConfig, epoch: int, device: torch.device, weight: float,
               sync: bool, selector_weight: float | None = None) -> StepStats:
    """Forward + backward of one packed row (its loss times `weight`); gradients are synchronised across ranks
    only when `sync` (the step's last micro-batch). DFlash2: `selector_weight` is this step's selector loss
    weight. Returns the row's statistics."""
    d = cfg.drafter
    samples = [s.decoded(device) for s in samples]  # features the reader left encoded decode on `device`
    batch = pack(samples, d.block_size, d.max_anchors, seed=cfg.training.seed, epoch=epoch,
                 max_tokens=cfg.training.tokens_per_step).to(device)
    no_sync = getattr(model, "no_sync", None)
    ctx = no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()
    with ctx:
        if batch.anchors.numel() == 0:  # nothing to learn here; still touch every parameter so DDP stays in step
            loss = sum(p.sum() for p in model.parameters()) * 0.0
            loss.backward()
            return StepStats.of_row(d.block_size, batch.num_tokens)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            hidden = model(*batch.drafter_inputs())
        out = drafter_loss(raw, hidden, batch, d, selector_weight)
        (out.loss * weight).backward()
    return StepStats.of_row(d.block_size, batch.num_tokens, batch.anchors.numel(), out, weight)


class Trainer:
    """One rank's training run: `setup` builds the model, optimizer, data schedule and resumes from the latest
    checkpoint; `step` is one optimizer step; `run` is the loop with checkpoints, progress and metrics."""

    def __init__(self, cfg: RunConfig):
        from flashdraft.target.model import set_cpu_threads

        self.cfg = cfg
        self.env = setup_distributed()
        set_cpu_threads(cfg, self.env.device.type, per_rank=True)
        self.io0 = io_counters()
        self.store = open_store(cfg.storage, cfg.run_id)
        self.latest = latest_checkpoint(self.store)
        # rank 0 logs each step to the trackers (tracking.report_to) as it is taken; the other ranks log nothing
        self.tracker = Tracker("train", [])

    def setup(self) -> None:
        """The model (wrapped for DDP/FSDP2), the optimizers, this rank's data schedule and, in a fresh run, the draft
        vocabulary; then, when there is a checkpoint, its weights, optimizer, RNG and data position."""
        cfg, t = self.cfg, self.cfg.training
        torch.manual_seed(t.seed)
        self.raw = build_model(cfg, self.env)
        self.model = wrap_model(self.raw, t, self.env)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizers(self.raw, self.params, t.optimizer, t.lr, t.weight_decay, t.muon_lr_scale)
        self.schedule = build_schedule(cfg, self.env)
        self.state = TrainState()
        # a resumed run gets its vocabulary back with the weights, a pretrained drafter keeps its own
        if self.raw.d2t is not None and not self.latest and cfg.drafter.init != "pretrained":
            build_draft_vocab(self.raw, self.schedule.vocabulary_samples())
        if self.latest:
            prefix = self.latest["prefix"]
            self.state.load_state_dict(load_checkpoint(self.store, prefix, self.model, self.optimizer.parts),
                                       self.store.url(f"{prefix}/trainer_state.json"))
            if self.raw.d2t is not None:
                self.raw.refresh_head()
            log.info("resumed from %s (step %d)", prefix, self.state.step)
            self.schedule.resume(self.store, prefix)
        self.steps_done = self.state.step
        self.resumed_from = self.steps_done if self.latest else None
        if self.steps_done > self.schedule.total_steps:
            raise TrainError(f"the committed checkpoint is at step {self.steps_done}, past the "
                             f"{self.schedule.total_steps} steps training.max_steps / epochs now give: training only "
                             f"carries on forward; use a new run_id, or --from train to train afresh")
        if self.latest and self.latest["final"] and self.steps_done < self.schedule.total_steps:
            log.info("training on from step %d to %d (training.max_steps / epochs raised)", self.steps_done,
                     self.schedule.total_steps)
        self.drafter_config = self.raw.config_dict()
        self.probe = HeldOutProbe.load(self.schedule.reader, self.schedule.heldout, cfg) \
            if self.schedule.heldout else None
        if cfg.training.heldout_samples and cfg.mode.kind == "streaming":
            log.warning("training.heldout_samples: no held-out curve in streaming mode (no data up front)")

    def heldout_point(self) -> None:
        """Evaluate the held-out probe now (every rank: collective under FSDP2) and record it."""
        entry = self.probe.evaluate(self.model, self.raw, self.steps_done)
        self.state.heldout.append(entry)
        self.tracker.log("train/heldout", {k: v for k, v in entry.items() if k != "step"}, entry["step"])
        if self.env.rank == 0:
            log.info("held-out at step %d: acceptance length %s (vLLM's scale: leading matching slots + 1 per "
                     "block, teacher-forced), accuracy by position %s", entry["step"], entry["tau"],
                     " ".join(f"{a:.2f}" for a in entry["acc_by_pos"]))

    def step(self, micro_batches: Iterator[MicroBatch]) -> dict | None:
        """One optimizer step: `grad_accum` micro-batches from `micro_batches` (gradients synchronised on the
        last), grad-norm clip, the scheduled lr, the optimizers' step; statistics summed over ranks and recorded in
        the trainer state. Returns the step's history entry, or None when the schedule is done (its data ran out,
        or its last step was taken)."""
        t0 = time.perf_counter()
        accum, total = self.cfg.training.grad_accum, self.schedule.total_steps
        stats = StepStats.zeros(self.cfg.drafter.block_size)
        d = self.cfg.drafter
        sel_w = selector_scale(self.steps_done, total, d.selector_weight, d.selector_warmup, d.selector_ramp)
        for k in range(accum):
            mb = next(micro_batches, None)
            if mb is None or self.steps_done >= total:  # the schedule's data ended, or its last step is done
                return None
            stats += micro_step(self.model, self.raw, mb.samples, self.cfg, mb.epoch, self.env.device, 1.0 / accum,
                                sync=k == accum - 1, selector_weight=sel_w)
            self.schedule.trained(len(mb.samples))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.training.grad_clip)
        lr = lr_at(self.steps_done, total, self.cfg)
        self.optimizer.set_lr(lr)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.steps_done += 1
        stats.all_reduce()
        elapsed = time.perf_counter() - t0
        entry = {"step": self.steps_done, "epoch": mb.epoch, "lr": lr, "grad_norm": round(float(grad_norm), 5),
                 **stats.metrics(self.env.world_size), "step_s": round(elapsed, 4)}
        if self.raw.candidate_selector is not None:
            entry["selector_weight"] = sel_w
        entry["tokens_per_s"] = round(entry["tokens"] / elapsed, 1)
        self.state.record(entry, elapsed, total, self.schedule.data_position(self.steps_done, mb.epoch))
        return entry

    def checkpoint(self, final: bool = False) -> str:
        """Save (with this rank's data state, if it has one); then the schedule may let go of covered data."""
        prefix = save_checkpoint(self.store, self.model, self.optimizer.parts, self.drafter_config,
                                 self.state.state_dict(), final=final, rank_state=self.schedule.rank_state())
        self.schedule.checkpointed(final)
        return prefix

    def run(self, stop_after: int | None = None) -> TrainSummary:
        """Train to the schedule's end, commit `metrics/train.json` and return it. `stop_after` ends the process's
        work after that many optimizer steps without a final checkpoint (simulated preemption for tests: the
        summary then holds only `stopped_at` and `total_steps`)."""
        total, rank0 = self.schedule.total_steps, self.env.rank == 0
        if rank0:
            self.tracker = open_tracker(self.cfg, "train", self.store)
        try:
            return self._loop(total, rank0, stop_after)
        finally:
            self.tracker.close()

    def _loop(self, total: int, rank0: bool, stop_after: int | None) -> TrainSummary:
        """`run`'s body: the optimizer steps with their held-out points, checkpoints, progress and tracking."""
        bar = tqdm(total=total, initial=self.steps_done, unit="step", desc="train", disable=not rank0 or None)
        if rank0:
            log.info("training %d trainable params, %d optimizer steps, world size %d, strategy %s, device %s",
                     sum(p.numel() for p in self.params), total, self.env.world_size, self.cfg.training.strategy,
                     self.env.device)
        self.model.train()
        if self.probe is not None and self.steps_done == 0:
            self.heldout_point()  # the curve's start: the initialised drafter
        micro_batches = self.schedule.micro_batches(self.steps_done)
        while (entry := self.step(micro_batches)) is not None:
            step = self.steps_done
            self.tracker.log("train", {k: v for k, v in entry.items() if k != "step"}, step)
            bar.update(1)
            bar.set_postfix(loss=f"{entry['loss']:.3f}", acc1=f"{entry['acc_by_pos'][0]:.3f}",
                            lr=f"{entry['lr']:.2e}", tok_s=f"{entry['tokens_per_s']:.0f}")
            if self.probe is not None and (step % self.cfg.training.heldout_every == 0 or step == total):
                self.heldout_point()
            if step % self.cfg.training.checkpoint_every == 0 and step < total:
                self.checkpoint()
                self.tracker.flush()  # a resume replays from here: what was logged before stays logged once
            if stop_after is not None and step >= stop_after and step < total:
                bar.close()
                return TrainSummary(stopped_at=step, total_steps=total)
        bar.close()
        if self.steps_done == 0:
            raise TrainError("no training data arrived (streaming reader ended before one optimizer step)")
        if self.probe is not None and self.state.heldout[-1]["step"] != self.steps_done:
            self.heldout_point()  # the data ended before `total`: the curve still ends at the last step
        self.state.step = self.state.total_steps = self.steps_done
        prefix = self.checkpoint(final=True)
        summary = self.summary(prefix)
        if rank0:
            self.store.commit_json(layout.metrics_key("train"), summary.dump())
            log.info("trained %d steps: loss %.4f, slot-1 acc %.3f, %.0f tokens/s; checkpoint %s", summary.steps,
                     summary.final.loss, summary.final.acc_by_pos[0], summary.tokens_per_s, prefix)
        return summary

    def peak_memory_bytes(self) -> int:
        """This rank's peak: the CUDA caching allocator's peak allocation on a GPU; on a CPU the process's peak RSS
        (file-backed pages of the memory-mapped frozen head included, as the kernel counts them)."""
        if self.env.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.env.device))
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def final_stats(self) -> FinalTrainStats:
        """The last 10% of steps averaged: a less noisy "final" loss, accuracy and cross-entropy per position."""
        tail = self.state.history[-max(1, len(self.state.history) // 10):]
        positions = range(self.cfg.drafter.block_size - 1)
        return FinalTrainStats(loss=sum(h["loss"] for h in tail) / len(tail),
                               acc_by_pos=[sum(h["acc_by_pos"][k] for h in tail) / len(tail) for k in positions],
                               ce_by_pos=[sum(h["ce_by_pos"][k] for h in tail) / len(tail) for k in positions])

    def summary(self, prefix: str) -> TrainSummary:
        """The `metrics/train.json` object: run figures, the final stats, every step's entry, the held-out curve."""
        cfg, state, raw = self.cfg, self.state, self.raw
        secs = max(state.train_seconds, 1e-9)
        # a copy with every field set, so the summary's JSON names each (dump() leaves out fields never set)
        parent = ParentIdentity(**raw.parent.model_dump()) if raw.parent is not None else None
        return TrainSummary(
            steps=state.step, world_size=self.env.world_size, strategy=cfg.training.strategy,
            drafter_kind=cfg.drafter.kind, device=str(self.env.device), checkpoint=prefix, tokens=state.tokens,
            train_seconds=round(secs, 3), tokens_per_s=round(state.tokens / secs, 1),
            trainable_params=sum(p.numel() for p in raw.parameters() if p.requires_grad),
            block_size=cfg.drafter.block_size, gamma=cfg.drafter.resolved_gamma,
            loss_normalization=cfg.drafter.loss_normalization, mask_token_id=raw.geometry.mask_token_id,
            trainable_mask=raw.geometry.trainable_mask, final=self.final_stats(), history=state.history,
            heldout=state.heldout, heldout_samples=[sid for _, _, sid in self.schedule.heldout],
            resumed_from=self.resumed_from, peak_memory_bytes=self.peak_memory_bytes(), parent=parent,
            dflash2_initialised=len(raw.initialised_not_loaded),
            store_io=io_counters(self.io0))  # this rank's (rank 0's) store operations and retries


def run_train(cfg: RunConfig, *, stop_after: int | None = None) -> TrainSummary:
    """Train (or resume, or carry on past a finished run's last step) and return the summary; see `Trainer.run`
    for `stop_after`. Whether to run at all is the runner's decision (flashdraft/run/runner.py)."""
    trainer = Trainer(cfg)
    trainer.setup()
    return trainer.run(stop_after=stop_after)


@torch.no_grad()
def evaluate_samples(model, samples: list[Sample], cfg: RunConfig, epoch: int = 0) -> dict:
    """Loss and per-position accuracy of `model` (a DFlashDrafter) on held-out samples, one row per sample."""
    d = cfg.drafter
    stats = StepStats.zeros(d.block_size)
    dev = next(model.parameters()).device
    model.eval()
    rows = 0
    for s in samples:
        batch = pack([s.decoded(dev)], d.block_size, d.max_anchors, seed=cfg.training.seed, epoch=epoch).to(dev)
        if batch.anchors.numel() == 0:
            continue
        out = drafter_loss(model, model(*batch.drafter_inputs()), batch, d)
        stats += StepStats.of_row(d.block_size, batch.num_tokens, batch.anchors.numel(), out)
        rows += 1
    return stats.metrics(max(rows, 1))
