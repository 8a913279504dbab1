"""`StepStats`: what one optimizer step measured, summed over its micro-batches and (after `all_reduce`) ranks.

The fields are float32 tensors, the dtype the loss statistics arrive in, so sums round the same on every rank
and the all-reduce is one collective over one flat tensor (`all_reduce` is the only place that packs them).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from flashdraft.components.train.distributed import all_reduce
from flashdraft.drafter.loss import LossOutput


@dataclass
class StepStats:
    loss: torch.Tensor      # [] sum of the micro-batch losses, each times its weight (1 / grad_accum)
    tokens: torch.Tensor    # [] tokens packed into the rows
    anchors: torch.Tensor   # [] anchor blocks trained
    ce_sum: torch.Tensor    # [B-1] cross-entropy per block position, summed over valid slots
    correct: torch.Tensor   # [B-1] argmax hits per block position
    count: torch.Tensor     # [B-1] valid slots per block position
    # DFlash2 (zeros for DFlash): selector loss (times weight, as `loss`), teacher-forced selector hits, rows the
    # selector trained on, valid slots whose gold token is in the LM head's top-k
    selector_loss: torch.Tensor
    selector_correct: torch.Tensor
    selector_rows: torch.Tensor
    topk_covered: torch.Tensor

    @classmethod
    def zeros(cls, block_size: int) -> StepStats:
        return cls(torch.zeros(()), torch.zeros(()), torch.zeros(()), torch.zeros(block_size - 1),
                   torch.zeros(block_size - 1), torch.zeros(block_size - 1), torch.zeros(()), torch.zeros(()),
                   torch.zeros(()), torch.zeros(()))

    @classmethod
    def of_row(cls, block_size: int, tokens: int, anchors: int = 0, out: LossOutput | None = None,
               weight: float = 1.0) -> StepStats:
        """One packed row's statistics: its tokens, and (when it had anchors) its loss output."""
        stats = cls.zeros(block_size)
        stats.tokens += tokens
        if out is not None:
            stats.loss += float(out.loss.detach()) * weight
            stats.anchors += anchors
            stats.ce_sum += out.ce_sum.float().cpu()
            stats.correct += out.correct.float().cpu()
            stats.count += out.count.float().cpu()
            if out.selector is not None:
                stats.selector_loss += float(out.selector.loss.detach()) * weight
                stats.selector_correct += out.selector.correct.float().cpu()
                stats.selector_rows += out.selector.rows.float().cpu()
                stats.topk_covered += out.selector.coverage.float().cpu()
        return stats

    def __iadd__(self, other: StepStats) -> StepStats:
        for f in fields(self):
            getattr(self, f.name).add_(getattr(other, f.name))
        return self

    def all_reduce(self) -> StepStats:
        """Sum over the ranks of the process group (unchanged in a single process)."""
        parts = [getattr(self, f.name) for f in fields(self)]
        flat = all_reduce(torch.cat([p.reshape(-1) for p in parts]))
        for f, p, chunk in zip(fields(self), parts, flat.split([p.numel() for p in parts]), strict=True):
            setattr(self, f.name, chunk.reshape(p.shape))
        return self

    def metrics(self, ranks: int = 1) -> dict:
        """The history entry's statistics; `loss` is the mean over `ranks` (rows, for held-out evaluation)."""
        safe = self.count.clamp_min(1)
        selector = {}
        if float(self.selector_rows) > 0:
            selector = {"selector_loss": round(float(self.selector_loss) / ranks, 6),
                        "selector_acc": round(float(self.selector_correct / self.selector_rows), 5),
                        "topk_coverage": round(float(self.topk_covered / self.count.sum().clamp_min(1)), 5)}
        return {**selector, "loss": round(float(self.loss) / ranks, 6), "tokens": int(self.tokens),
                "anchors": int(self.anchors),
                "ce_by_pos": [round(float(x), 5) for x in self.ce_sum / safe],
                "acc_by_pos": [round(float(x), 5) for x in self.correct / safe],
                "acc": round(float(self.correct.sum() / self.count.sum().clamp_min(1)), 5)}
