"""Data schedules: which packed rows (micro-batches) a rank trains on, in what order, for how many steps, and how
its data position is checkpointed and resumed. The offline/streaming difference lives here and nowhere else.

* `OfflineSchedule`: epochs over every committed shard. Rows are packed greedily by length to
  `training.tokens_per_step` tokens (`group_sizes`, from shard headers alone), so every rank knows its micro-batch
  count per epoch without reading data, ranks agree on the minimum, and the data position is a function of the
  optimizer step: (epoch, micro-batches done in it).
* `StreamSchedule` (`mode.kind=streaming`): the reader's streaming window, packed on the fly; ranks stop together
  when one runs dry. The data position is each rank's stream position (samples trained), saved per rank with
  every checkpoint; a part leaves the window only once a checkpoint covers it, so a resume replays exactly.
  A draft vocabulary (`drafter.draft_vocab_size`) is counted from the generated replies (`response_samples`):
  generation has finished before streaming training starts, and the replies' tokens are exactly the response
  tokens the features carry, so the vocabulary is the one an offline run picks.
"""

from __future__ import annotations

import logging
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.distributed as dist

from flashdraft.components.train.distributed import DistEnv, all_reduce, from_rank0
from flashdraft.components.train.heldout import select_heldout
from flashdraft.config import RunConfig, TrainingConfig
from flashdraft.drafter.batch import group_sizes, token_budget_groups
from flashdraft.features.manifest import RecordedPart, recorded_parts
from flashdraft.features.reader import OfflineReader, StreamReader, open_reader
from flashdraft.features.shard import Sample
from flashdraft.run.records import iter_responses
from flashdraft.storage import layout
from flashdraft.storage.checkpoint import load_rank_state
from flashdraft.storage.source import data_store
from flashdraft.storage.store import ObjectStore, open_store

log = logging.getLogger(__name__)


class TrainError(RuntimeError):
    """Training cannot start or continue; the message says why and what to change."""


@dataclass(frozen=True)
class MicroBatch:
    """The samples of one packed row, and the epoch their anchors are drawn for."""

    epoch: int
    samples: list[Sample]


class DataSchedule(ABC):
    """What the trainer asks of its data: this rank's micro-batches, the number of optimizer steps, and its part
    in checkpoints (what to save, what a checkpoint lets go, how to resume)."""

    total_steps: int
    heldout: list[tuple[str, int, str]] = []  # (part, index, sample id) held out of training (heldout.py)

    @abstractmethod
    def micro_batches(self, start_step: int) -> Iterator[MicroBatch]:
        """This rank's rows from optimizer step `start_step` on (streaming: from the resumed stream position)."""

    @abstractmethod
    def data_position(self, step: int, epoch: int) -> dict:
        """The data position recorded in the trainer state after optimizer step `step`."""

    @abstractmethod
    def vocabulary_samples(self) -> Iterable[Sample]:
        """One pass over this rank's samples, to pick the draft vocabulary from before training."""

    @abstractmethod
    def resume(self, store: ObjectStore, prefix: str) -> None:
        """Continue from the checkpoint at `prefix` (the trainer restores model, optimizer and step)."""

    @abstractmethod
    def trained(self, samples: int) -> None:
        """`samples` more samples went into a trained row."""

    @abstractmethod
    def rank_state(self) -> dict | None:
        """This rank's data state to save with a checkpoint, if it has one of its own."""

    @abstractmethod
    def checkpointed(self, final: bool) -> None:
        """A checkpoint (the last one when `final`) now covers everything trained so far."""


class OfflineSchedule(DataSchedule):
    """Epochs over every committed shard; rows sized from shard headers, the same micro-batch count on every rank."""

    def __init__(self, reader: OfflineReader, training: TrainingConfig):
        self.reader, self.grad_accum = reader, training.grad_accum
        self.sizes: list[list[int]] = []  # per epoch: samples in each of this rank's rows
        for epoch in range(training.epochs):
            order = reader.worker_order(epoch)
            lengths = [reader.header(k).samples[i].num_tokens for k, i in order]
            self.sizes.append(group_sizes(lengths, training.tokens_per_step))
        counts = all_reduce(torch.tensor([len(s) for s in self.sizes], dtype=torch.long), dist.ReduceOp.MIN)
        self.steps_per_epoch = [int(c) // training.grad_accum for c in counts]
        if sum(self.steps_per_epoch) == 0:
            raise TrainError(f"not enough feature data for one optimizer step: {counts.tolist()} rows per epoch on "
                             f"the smallest rank, training.grad_accum={training.grad_accum}; extract more samples "
                             f"or lower training.tokens_per_step / grad_accum")
        total = sum(self.steps_per_epoch)
        self.total_steps = min(total, training.max_steps) if training.max_steps else total

    def epoch_of(self, step: int) -> tuple[int, int]:
        """(epoch, optimizer steps already done in it) at optimizer step `step`."""
        for epoch, n in enumerate(self.steps_per_epoch):
            if step < n:
                return epoch, step
            step -= n
        return len(self.steps_per_epoch), 0

    def micro_batches(self, start_step: int) -> Iterator[MicroBatch]:
        epoch, steps_done = self.epoch_of(start_step)
        while epoch < len(self.steps_per_epoch):
            sizes = self.sizes[epoch][: self.steps_per_epoch[epoch] * self.grad_accum]
            first = steps_done * self.grad_accum
            self.reader.load_state_dict({"seed": self.reader.seed, "epoch": epoch, "consumed": sum(sizes[:first])})
            it = iter(self.reader)
            try:
                for n in sizes[first:]:
                    yield MicroBatch(epoch, [next(it) for _ in range(n)])
            finally:
                it.close()
            epoch, steps_done = epoch + 1, 0

    def data_position(self, step: int, epoch: int) -> dict:
        return {"epoch": epoch, "step_in_epoch": self.epoch_of(step)[1]}

    def vocabulary_samples(self) -> Iterable[Sample]:
        return self.reader

    # The data position is a function of the optimizer step (`epoch_of`): nothing of its own to save or restore.
    def resume(self, store: ObjectStore, prefix: str) -> None:
        pass

    def trained(self, samples: int) -> None:
        pass

    def rank_state(self) -> dict | None:
        return None

    def checkpointed(self, final: bool) -> None:
        pass


class StreamSchedule(DataSchedule):
    """The streaming window, packed as it arrives; the stream position is saved per rank with each checkpoint."""

    def __init__(self, reader: StreamReader, training: TrainingConfig, total_steps: int,
                 replies: Callable[[], Iterable[Sample]]):
        self.reader, self.tokens_per_step, self.total_steps = reader, training.tokens_per_step, total_steps
        self.replies = replies
        self.position = 0  # samples this rank has trained on since the stream began

    def micro_batches(self, start_step: int) -> Iterator[MicroBatch]:
        for group in token_budget_groups(self.reader, self.tokens_per_step):
            if all_reduce(torch.ones(1), dist.ReduceOp.MIN).item() == 0:  # another rank's stream ended
                return
            yield MicroBatch(0, group)
        all_reduce(torch.zeros(1), dist.ReduceOp.MIN)  # tell the others this one ended

    def data_position(self, step: int, epoch: int) -> dict:
        return {"epoch": epoch, "step_in_epoch": None}

    def vocabulary_samples(self) -> Iterable[Sample]:
        return self.replies()

    def resume(self, store: ObjectStore, prefix: str) -> None:
        state = load_rank_state(store, prefix)
        if state is None:
            log.warning("streaming resume without a saved stream position for this rank (saved with another "
                        "world size?): the reader restarts at the first part still in the window")
            return
        self.reader.resume_follow(state)
        self.position = int(state["position"])

    def trained(self, samples: int) -> None:
        self.position += samples

    def rank_state(self) -> dict | None:
        return self.reader.follow_state(self.position)

    def checkpointed(self, final: bool) -> None:
        # at the end, every part taken up is done with, trained on or not (max_steps)
        self.reader.release_through(sys.maxsize if final else self.position)


def stream_total_steps(cfg: RunConfig) -> int:
    """`training.max_steps`, or the steps the expected stream fills (samples x tokens x `mode.reuse`)."""
    if cfg.training.max_steps:
        return cfg.training.max_steps
    samples = cfg.data.expected_samples or cfg.data.max_samples
    if not samples:
        raise TrainError("streaming mode needs training.max_steps, or data.expected_samples to size the schedule")
    tokens = samples * cfg.data.expected_tokens_per_sample * cfg.mode.reuse
    return max(1, tokens // (cfg.training.tokens_per_step * cfg.training.grad_accum * cfg.training.world_size))


def response_samples(store: ObjectStore, num_shards: int, rank: int, world_size: int) -> Iterator[SimpleNamespace]:
    """This rank's share (every world_size-th row) of the generated replies, as input_ids/loss_mask samples: what
    a streaming run counts its draft vocabulary over before the first feature part arrives."""
    missing = [k for k in range(num_shards) if not store.is_committed(layout.responses_done_key(k))]
    if missing:
        raise TrainError(f"drafter.draft_vocab_size in streaming mode counts every generated reply before training, "
                         f"but generation shard(s) {missing} are not done: run generate first")
    index = 0
    for shard in range(num_shards):
        for row in iter_responses(store, shard):
            if index % world_size == rank:
                yield SimpleNamespace(input_ids=torch.tensor(row["input_ids"], dtype=torch.long),
                                      loss_mask=torch.tensor(row["loss_mask"], dtype=torch.bool))
            index += 1


def part_list(cfg: RunConfig) -> list[RecordedPart]:
    """The offline part list: extract's DONE records, checked against the store once, on rank 0, and broadcast,
    so every rank orders the same parts (a part the store does not hold is refused by name)."""
    rows = from_rank0(lambda: [p.to_json() for p in recorded_parts(data_store(cfg), cfg.data.num_shards)])
    return [RecordedPart.from_json(row) for row in rows]


def build_schedule(cfg: RunConfig, env: DistEnv) -> DataSchedule:
    """This rank's schedule over the run's feature shards (the reader checks their provenance against `cfg`)."""
    defer = cfg.training.feature_decode == "device" or (cfg.training.feature_decode == "auto"
                                                         and env.device.type == "cuda")
    if cfg.mode.kind == "streaming":
        reader = open_reader(cfg, rank=env.rank, world_size=env.world_size, defer_release=True, defer_decode=defer)
        store = open_store(cfg.storage, cfg.run_id)
        replies = lambda: response_samples(store, cfg.data.num_shards, env.rank, env.world_size)  # noqa: E731
        return StreamSchedule(reader, cfg.training, stream_total_steps(cfg), replies)
    reader = open_reader(cfg, rank=env.rank, world_size=env.world_size, defer_decode=defer, parts=part_list(cfg))
    try:
        heldout = select_heldout(reader, cfg.training.heldout_samples)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    reader.exclude = frozenset(sample_id for _, _, sample_id in heldout)  # before any epoch is sized
    schedule = OfflineSchedule(reader, cfg.training)
    schedule.heldout = heldout
    return schedule
