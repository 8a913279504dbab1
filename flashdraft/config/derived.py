"""Defaults of the DFlash drafter that follow from other settings: which target layers it reads, and the loss
decay for a block size. The run config derives these instead of typing them, so a preset cannot disagree with the
target it names. Pure functions of config values, so they sit in `config` (the bottom layer) and the drafter
reads them from here."""

from __future__ import annotations

from flashdraft.config.errors import ConfigError


def dflash_layer_ids(num_layers: int, num_features: int) -> list[int]:
    """Target layer ids by the z-lab DFlash rule: uniform from 1 to L-3, Python (half-even) rounding.

    Id i means the OUTPUT of 0-based decoder layer i, i.e. HF `hidden_states[i + 1]`; vLLM/speculators
    "aux layer" ids are these + 1.
    """
    if num_layers < 5 and num_features > 1:
        raise ConfigError(f"target.num_layers={num_layers}: DFlash needs at least 5 target layers")
    if num_features == 1:
        return [num_layers // 2]
    start, end = 1, num_layers - 3
    ids = [round(start + i * (end - start) / (num_features - 1)) for i in range(num_features)]
    if len(set(ids)) < len(ids):  # layers 1..L-3 hold fewer than num_features distinct ids
        raise ConfigError(f"features.num_features={num_features}: the DFlash rule over a {num_layers}-layer target "
                          f"repeats ids {ids} (it needs >= {num_features + 3} layers); set features.layer_ids or "
                          "fewer features")
    return ids


def default_gamma(block_size: int) -> float:
    """Loss decay gamma from the DFlash paper (7 for B=16, 5 for B=10, 4 for B=8); other B interpolate."""
    table = {16: 7.0, 10: 5.0, 8: 4.0}
    if block_size in table:
        return table[block_size]
    return round(4.0 + (block_size - 8) * 0.375, 3)
