"""The held-out curve's acceptance length is on vLLM's scale: per block, the leading run of matching slots + 1."""

from __future__ import annotations

import torch

from flashdraft.components.train.heldout import acceptance_lengths


def test_acceptance_length_is_the_leading_run_plus_one_per_block():
    """Blocks by hand: hits [1,1,0,1] -> 2 + 1 = 3; [0,1,1,1] -> 1; [1,1,1,1] -> 5; [1,1,1,1] with its third slot
    masked (past the response end) -> 3: the masked slot ends the run; a block with no valid slot is not counted.
    Mean (3 + 1 + 5 + 3) / 4 = 3.0, where pooled per-position accuracy products would give another figure."""
    hit = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    valid = torch.ones(5, 4, dtype=torch.bool)
    valid[3, 2] = False
    valid[4] = False
    lengths = acceptance_lengths(hit, valid)
    assert lengths.tolist() == [3.0, 1.0, 5.0, 3.0]
    assert float(lengths.mean()) == 3.0
