"""FLOPs of one trainer step (forward + backward) on one packed row, counted from its shapes: the one FLOP model
of the planner (components/plan, from the config's shape) and the GPU check (benchmarks/gpu_check, from the very
row it trained), held equal to torch's FlopCounterMode on a real step by a unit test.

Forward, per context token: fc (2*n*H*H) and every layer's K/V projections (2*2*H*kv*hd); per drafted position:
the q, o, k, v projections and the MLP; attention 4*hd*heads per allowed (query, key) pair (QK^T and PV); the LM
head 2*V*H per scored slot. Backward: twice the forward (input and weight gradients), except fc (weight gradient
only: the features need none) and the frozen LM head (input gradient only), once. DFlash2 adds, per drafted
position and layer, its two block convolutions' kernel projections (2*H*2*taps*groups each; the depthwise
convolution itself is elementwise) and, per scored slot, the candidate selector: hidden projection 2*H*r, pairwise
scores 2*r*k and the candidates' unary logits 2*k*H (the candidates come from the head's logits the loss forms
anyway).
"""

from __future__ import annotations

from flashdraft.perf.calibration import TrainShape


def drafted(s: TrainShape) -> tuple[int, int]:
    """(drafted positions, scored slots) of a row of `s`: anchors_per_row x block, x (block - 1)."""
    n = s.anchors_per_row or 0.0
    return int(round(n * s.block_size)), int(round(n * (s.block_size - 1)))


def step_flops(s: TrainShape, tokens: int, positions: int, loss_rows: int, pairs: float) -> dict[str, float]:
    """FLOPs by part of one step on a row of `tokens` context tokens, `positions` drafted positions, `loss_rows`
    scored slots and `pairs` allowed attention (query, key) pairs summed over the layers."""
    H, L = s.hidden_size, s.num_layers
    q, kvd, inter = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size
    fc = tokens * 2 * s.num_features * H * H
    ctx_kv = tokens * L * 4 * H * kvd
    per_position = L * (4 * H * q + 4 * H * kvd + 6 * H * inter)
    parts = {"draft layers": 2 * fc + 3 * (ctx_kv + positions * per_position),
             "LM head": 2 * 2 * s.vocab_size * H * loss_rows,
             "attention": 3 * 4 * s.head_dim * s.num_heads * pairs}
    if s.kind == "dflash2":
        taps, groups, r, k = s.conv_kernel_size, H // s.conv_group_size, s.selector_rank, s.selector_top_k
        parts["DFlash2 block convolutions"] = 3 * positions * L * 2 * (2 * H * 2 * taps * groups)
        # selector_detach detaches the slot states (dflash2.py selector_loss): the unary logits (frozen head rows)
        # get no backward at all and hidden_projection only its weight gradient
        through_h = 0 if s.selector_detach else 1
        parts["DFlash2 selector"] = loss_rows * ((2 + through_h) * 2 * H * r + 3 * 2 * r * k
                                                 + (1 + through_h) * 2 * k * H)
    return parts


def trainer_flops(s: TrainShape, window_keys: float) -> dict[str, float]:
    """`step_flops` of the row `s` describes (anchors_per_row set), with `window_keys` the mean context keys a
    drafted position sees (the caller's estimate) besides its own block."""
    positions, loss_rows = drafted(s)
    return step_flops(s, s.tokens_per_step, positions, loss_rows,
                      s.num_layers * positions * (window_keys + s.block_size))


MUON_NS_STEPS = 5  # torch.optim.Muon's default Newton-Schulz iterations (components/train/optim.py keeps it)


def muon_matrix_shapes(s: TrainShape) -> list[tuple[int, int]]:
    """(out, in) of every weight Muon updates under training.optimizer=muon (components/train/optim.py
    `muon_matrices`: the trainable Linear weights): fc, q/k/v/o and the MLP of each layer, DFlash2's two kernel
    projections a layer and the selector's hidden projection; [] under AdamW."""
    if s.optimizer != "muon":
        return []
    H, q, kv, inter = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size
    layer = [(q, H), (kv, H), (kv, H), (H, q), (inter, H), (inter, H), (H, inter)]
    if s.kind == "dflash2":
        layer += [(2 * s.conv_kernel_size * (H // s.conv_group_size), H)] * 2
    out = layer * s.num_layers + [(H, s.num_features * H)]
    return out + [(s.selector_rank, H)] if s.kind == "dflash2" else out


def muon_step_flops(s: TrainShape) -> float:
    """FLOPs of one Muon optimizer step: per matrix (short side m, long side n) and Newton-Schulz iteration, the
    Gram product X X^T (2 m^2 n), its square (2 m^3) and the update's product with X (2 m^2 n). Every rank runs
    every whole matrix (FSDP2 gathers each one: `WholeMatrixMuon`), so this is one rank's work, once a step
    whatever the batch: on a small CPU step it outweighs forward and backward (docs/training.md)."""
    return float(sum(MUON_NS_STEPS * (4 * min(a, b) ** 2 * max(a, b) + 2 * min(a, b) ** 3)
                     for a, b in muon_matrix_shapes(s)))

