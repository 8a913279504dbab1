"""The train stage's summary (metrics/train.json) and the streaming window's figures it carries."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from flashdraft.drafter.identity import ParentIdentity
from flashdraft.run.stage import StageSummary, numbers


class FinalTrainStats(BaseModel):
    model_config = ConfigDict(extra="allow")

    loss: float = Field(description="mean loss over the last 10% of steps")
    acc_by_pos: list[float] = Field(description="mean accuracy per block position over the last 10% of steps")
    ce_by_pos: list[float] = Field(default_factory=list, description="mean cross-entropy per block position over "
                                   "the last 10% of steps")


class StreamStats(BaseModel):
    """pipelines/runtime.py's window monitor in a local streaming run (metrics/stream.json)."""

    model_config = ConfigDict(extra="allow")

    produced_bytes: int = Field(description="bytes of every part ever produced")
    produced_parts: int = Field(description="parts ever produced")
    peak_stored_bytes: int = Field(description="most bytes held in the window at once")
    peak_stored_parts: int = Field(description="most parts held at once")
    window_bytes: int = Field(description="mode.window_bytes")
    window_shards: int = Field(description="mode.window_shards")
    reuse: int = Field(description="mode.reuse")
    stopped_early: bool = Field(description="the trainer finished before the producers")
    failed_listings: int = Field(0, description="samples of the window that failed past the store's retry budget "
                                 "(counted; the monitor carries on)")


class TrainSummary(StageSummary):
    """components/train/trainer.py: the trainer's summary (metrics/train.json), built by `Trainer.summary`."""

    HEADLINE: ClassVar[tuple[str, str] | None] = (
        "steps",
        "{steps:,.0f} steps, loss {final_loss:,.3f}, slot-1 accuracy {slot1_accuracy:,.3f}, "
        "{tokens_per_s:,.0f} tokens/s{start}")

    HANDOFF_EXCLUDE: ClassVar[frozenset[str]] = frozenset({"history", "heldout", "heldout_samples"})  # bulky

    steps: int | None = Field(None, description="optimizer steps done")
    world_size: int | None = Field(None, description="ranks that trained")
    strategy: str | None = Field(None, description="training.strategy (ddp or fsdp2)")
    drafter_kind: str | None = Field(None, description="drafter.kind (dflash or dflash2)")
    checkpoint: str | None = Field(None, description="the final checkpoint's store prefix")
    tokens: int = Field(0, description="tokens trained on")
    train_seconds: float | None = Field(None, description="summed optimizer-step wall time")
    tokens_per_s: float | None = Field(None, description="training tokens per second")
    trainable_params: int | None = Field(None, description="parameters the optimizer updates")
    block_size: int | None = Field(None, description="drafter.block_size")
    gamma: float | None = Field(None, description="the loss decay used (drafter.gamma or the paper's default)")
    loss_normalization: str | None = Field(None, description="drafter.loss_normalization")
    mask_token_id: int | None = Field(None, description="the drafter's mask token")
    trainable_mask: bool | None = Field(None, description="the mask token's embedding is trained")
    final: FinalTrainStats | None = Field(None, description="last-10%-of-steps loss and accuracy")
    history: list[dict[str, Any]] = Field(default_factory=list, description="one entry per optimizer step")
    heldout: list[dict[str, Any]] = Field(
        default_factory=list, description="the held-out curve: {step, acc_by_pos, tau, blocks} every "
                                          "training.heldout_every steps (components/train/heldout.py)")
    heldout_samples: list[str] = Field(default_factory=list, description="sample ids held out of training")
    streaming: StreamStats | None = Field(None, description="local streaming run: the window's figures")
    resumed_from: int | None = Field(None, description="the checkpoint step this launch resumed from (a preempted "
                                     "or retried task, or training.preempt_after); None = trained from step 0")
    parent: ParentIdentity | None = Field(None, description="the pretrained drafter training started from "
                                          "(drafter.init=pretrained); None = a new drafter")
    dflash2_initialised: int = Field(0, description="a DFlash parent starting a dflash2 run: the DFlash2-only "
                                                    "tensors (convolutions, selector) initialised, not loaded")
    peak_memory_bytes: int | None = Field(None, description="rank 0's peak memory in this launch: CUDA peak "
                                          "allocated, or on a CPU the peak RSS (mapped head pages included)")
    store_io: dict[str, int] | None = Field(None, description="rank 0's store operations and retries in this launch")
    stopped_at: int | None = Field(None, description="training.preempt_after: the step this launch stopped at "
                                   "(simulated preemption, no final checkpoint); the summary then holds only this "
                                   "and total_steps")
    total_steps: int | None = Field(None, description="with stopped_at: the schedule's length")

    def figures(self) -> dict[str, float]:
        final = self.final
        last = self.heldout[-1] if self.heldout else {}
        return numbers({"steps": self.steps, "final_loss": final.loss if final else None,
                        "slot1_accuracy": final.acc_by_pos[0] if final and final.acc_by_pos else None,
                        "tokens_per_s": self.tokens_per_s, "heldout_tau": last.get("tau"),
                        "heldout_slot1_accuracy": (last.get("acc_by_pos") or [None])[0],
                        "pretrained": 1.0 if self.parent else None,
                        "dflash2_parts_initialised": float(self.dflash2_initialised) if self.parent else None})

    @classmethod
    def headline_values(cls, figures: dict[str, float]) -> dict[str, Any]:
        """The figures, and how the drafter started when it was not from scratch (the console says it)."""
        start = ""
        if figures.get("pretrained"):
            fresh = int(figures.get("dflash2_parts_initialised") or 0)
            new = f" (DFlash checkpoint: {fresh} DFlash2 tensors initialised)" if fresh else ""
            start = f"; trained on from a pretrained drafter{new}"
        return {**cls.derive(figures), "start": start}

