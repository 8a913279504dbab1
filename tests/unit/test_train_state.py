"""`TrainState` (components/train/state.py): the checkpoint's trainer_state.json layout, old checkpoints, bad ones."""

from __future__ import annotations

import json

import pytest

from flashdraft.components.train.schedule import TrainError
from flashdraft.components.train.state import TrainState

ENTRY = {"step": 1, "epoch": 0, "lr": 1e-3, "loss": 2.5, "tokens": 128, "acc_by_pos": [0.1], "step_s": 0.2}


def test_a_fresh_state_names_no_data_position_until_a_step_sets_one():
    state = TrainState()
    assert state.state_dict() == {"step": 0, "history": [], "train_seconds": 0.0, "tokens": 0, "heldout": []}
    state.record(ENTRY, 0.25, total_steps=6, data_position={"epoch": 0, "step_in_epoch": 1})
    state.record({**ENTRY, "step": 2}, 0.5, total_steps=6, data_position={"epoch": 0, "step_in_epoch": 2})
    saved = state.state_dict()
    assert saved == {"step": 2, "history": [ENTRY, {**ENTRY, "step": 2}], "train_seconds": 0.75, "tokens": 256,
                     "heldout": [], "total_steps": 6, "data_position": {"epoch": 0, "step_in_epoch": 2}}
    again = TrainState()
    again.load_state_dict(json.loads(json.dumps(saved)), "trainer_state.json")  # through JSON, as a checkpoint
    assert again == state and again.state_dict() == saved


def test_a_checkpoint_from_before_the_heldout_curve_loads_and_a_damaged_one_is_refused_by_name():
    old = {"step": 4, "history": [ENTRY], "train_seconds": 1.5, "tokens": 512, "total_steps": 8,
           "data_position": {"epoch": 0, "step_in_epoch": 4}}
    state = TrainState()
    state.load_state_dict(old, "trainer_state.json")
    assert (state.step, state.heldout, state.total_steps) == (4, [], 8)
    with pytest.raises(TrainError, match=r"s3://b/run/checkpoints/step-00000004/trainer_state.json: trainer state "
                                         r"lacks history, tokens"):
        TrainState().load_state_dict({"step": 4, "train_seconds": 1.0},
                                     "s3://b/run/checkpoints/step-00000004/trainer_state.json")
