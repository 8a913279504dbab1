"""`TrainState`: the trainer's progress beside the weights, one typed object behind one `state_dict()`.

A checkpoint (flashdraft/storage/checkpoint.py) commits `state_dict()` as `trainer_state.json` and a resumed run
reads it back with `load_state_dict`. The JSON layout is the one checkpoints always had (step, history,
train_seconds, tokens, heldout, and from the first optimizer step total_steps and data_position), so checkpoints
already in a store load unchanged; one written before the held-out curve existed (no `heldout`) loads with an empty
curve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flashdraft.components.train.schedule import TrainError

REQUIRED = ("step", "history", "train_seconds", "tokens")


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per optimizer step (Trainer.step)
    train_seconds: float = 0.0  # summed step wall time
    tokens: int = 0  # tokens trained on
    heldout: list[dict[str, Any]] = field(default_factory=list)  # the held-out curve (heldout.py)
    total_steps: int | None = None  # the schedule's length when last saved; None before the first step
    data_position: dict[str, Any] | None = None  # epoch and micro-batches done (schedule.py); None before a step

    def record(self, entry: dict[str, Any], seconds: float, total_steps: int, data_position: dict[str, Any]) -> None:
        """One optimizer step's history entry, its time and tokens, and where the data stands after it."""
        self.history.append(entry)
        self.train_seconds += seconds
        self.tokens += entry["tokens"]
        self.step, self.total_steps, self.data_position = entry["step"], total_steps, data_position

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's `trainer_state.json` object (total_steps and data_position once a step set them)."""
        out: dict[str, Any] = {"step": self.step, "history": self.history, "train_seconds": self.train_seconds,
                               "tokens": self.tokens, "heldout": self.heldout}
        if self.total_steps is not None:
            out["total_steps"] = self.total_steps
        if self.data_position is not None:
            out["data_position"] = self.data_position
        return out

    def load_state_dict(self, state: dict[str, Any], source: str) -> None:
        """Restore from a checkpoint's `trainer_state.json` (`source` names it in an error)."""
        missing = [k for k in REQUIRED if k not in state]
        if missing:
            raise TrainError(f"{source}: trainer state lacks {', '.join(missing)} (not a flashdraft checkpoint, or "
                             f"a damaged one): use a new run_id, or --from train to train afresh")
        self.step, self.history = int(state["step"]), list(state["history"])
        self.train_seconds, self.tokens = float(state["train_seconds"]), int(state["tokens"])
        self.heldout = list(state.get("heldout", []))
        self.total_steps, self.data_position = state.get("total_steps"), state.get("data_position")
