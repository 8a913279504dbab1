"""The held-out curve: every `training.heldout_every` optimizer steps, the drafter's per-position accuracy and
offline tau on feature samples it never trains on (docs/evaluation.md, "The held-out curve").

Held out: `training.heldout_samples` of the run's own extracted features (no second target pass), those with the
smallest SHA-256 of their sample id, so the choice is spread over shards, independent of the seed and stable
across a resume. The offline reader leaves them out of every epoch and of the draft vocabulary count; the probe
reads them once and keeps them in memory. Scored teacher-forced on the target's own features, anchors drawn as in
training (seed, epoch 0) so every evaluation scores the same blocks:
* `acc_by_pos`: per block position k, the fraction of valid slots whose argmax equals the label;
* `tau`: the expected acceptance length on the scale vLLM reports ("mean acceptance length", the bonus token
  included; speculators' `eal` since its PR #1032): per anchor block with a valid slot, the leading run of slots
  whose argmax equals the label, plus 1; a masked slot (past the response end) ends the run. Its gap to the
  evaluate stage's served tau is the drafter's drift on its own context.
Offline mode only: a streaming run has no data up front to hold out (the trainer logs that and goes on).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

import torch

from flashdraft.config import RunConfig
from flashdraft.drafter.batch import pack
from flashdraft.drafter.vocab import draft_labels
from flashdraft.features.reader import OfflineReader
from flashdraft.features.shard import Sample

log = logging.getLogger(__name__)
LOGIT_ROWS = 256  # slots scored per head GEMM: bounds the [rows x vocab] logits (248k vocab: 250 MB in fp32)


def select_heldout(reader: OfflineReader, count: int) -> list[tuple[str, int, str]]:
    """(part key, index, sample id) of the `count` held-out samples: the smallest SHA-256 of the sample id."""
    if count <= 0:
        return []
    keys = reader.part_keys()
    items = [(k, i, s.sample_id) for k in keys for i, s in enumerate(reader.header(k).samples)]
    if count >= len(items):
        raise ValueError(f"training.heldout_samples={count} would hold out all {len(items)} extracted samples; "
                         "lower it (a few percent of the data is enough for a curve)")
    return sorted(items, key=lambda t: hashlib.sha256(t[2].encode()).hexdigest())[:count]


def acceptance_lengths(hit: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per block [N, B-1] -> [blocks]: 1 + the leading run of hits, over the blocks with at least one valid slot
    (a hit needs a valid slot: a masked slot breaks the run)."""
    hit = hit.bool() & valid.bool()
    blocks = valid.bool().any(dim=1)
    return 1.0 + hit[blocks].float().cumprod(dim=1).sum(dim=1)


@dataclass
class HeldOutProbe:
    """The held-out samples, in memory, and the evaluation run on them."""

    samples: list[Sample]
    cfg: RunConfig

    @classmethod
    def load(cls, reader: OfflineReader, chosen: list[tuple[str, int, str]], cfg: RunConfig) -> HeldOutProbe | None:
        if not chosen:
            return None
        return cls([reader.fetch(key, index) for key, index, _ in chosen], cfg)

    @torch.no_grad()
    def evaluate(self, model, raw, step: int) -> dict:
        """{step, acc_by_pos, tau, blocks} of `model` (the wrapped drafter; `raw` the unwrapped one, for its head).
        Collective under FSDP2: every rank calls it with the same samples."""
        t0 = time.perf_counter()
        d, device = self.cfg.drafter, raw.head_weight.device
        was_training = model.training
        model.eval()
        hits, valid = [], []
        for s in self.samples:
            batch = pack([s.decoded(device)], d.block_size, d.max_anchors, seed=self.cfg.training.seed,
                         epoch=0).to(device)
            if batch.anchors.numel() == 0:
                continue
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                hidden = model(*batch.drafter_inputs())
            labels, ok = batch.labels, batch.valid
            if raw.d2t is not None:
                labels, ok = draft_labels(labels, ok, raw.target_to_draft())
            slots = hidden[:, 1:, :].reshape(-1, hidden.shape[-1])
            weight = raw.head_weight
            pred = torch.cat([(slots[i:i + LOGIT_ROWS].to(weight.dtype) @ weight.T).argmax(-1)
                              for i in range(0, slots.shape[0], LOGIT_ROWS)]).view(labels.shape)
            hits.append((pred == labels) & ok)
            valid.append(ok)
        model.train(was_training)
        if not hits:
            return {"step": step, "acc_by_pos": [], "tau": None, "blocks": 0, "seconds": 0.0}
        hit, ok = torch.cat(hits), torch.cat(valid)
        acc = hit.float().sum(0) / ok.float().sum(0).clamp_min(1)
        lengths = acceptance_lengths(hit, ok)
        return {"step": step, "acc_by_pos": [round(float(a), 5) for a in acc],
                "tau": round(float(lengths.mean()), 4) if lengths.numel() else None,
                "blocks": int(lengths.numel()), "seconds": round(time.perf_counter() - t0, 3)}
