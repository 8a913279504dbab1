"""Capture the target's intermediate hidden states for DFlash, and only those.

Layer-id convention (z-lab DFlash, used everywhere in flashdraft): id ``i`` is the OUTPUT of the 0-based decoder
layer ``model.model.layers[i]``, which equals Hugging Face ``output_hidden_states=True`` -> ``hidden_states[i + 1]``
(``hidden_states[0]`` is the embedding output). vLLM / speculators "aux hidden state layer" ids are ``i + 1``.
Getting this off by one silently ruins acceptance, so tests/unit/test_capture.py pins it against a plain HF forward.

Why hooks instead of ``output_hidden_states``: that flag keeps every layer's states alive and still runs the final
norm, lm_head and the [T, vocab] logits. Forward hooks on just the configured layers keep only what is needed, and
with ``stop_after_deepest=True`` the hook on the deepest id raises a private exception that `LayerCapture.forward`
swallows, so no deeper layer, final norm, lm_head or logits run at all.

Usage (extraction, stop early)::

    with capture_layers(model, [1, 8, 14, 20, 27], stop_after_deepest=True) as cap:
        cap.forward(input_ids=ids, position_ids=pos)        # runs model.model (no lm_head), stops at layer 27
        feats = cap.features()                               # [B, T, 5 * H], ids in increasing order

Usage (evaluation, full forward with logits, possibly several incremental forwards with a KV cache)::

    with capture_layers(model, ids) as cap:
        out = model(input_ids=ids, cache=cache, use_cache=True)
        ctx = cap.features()                                 # features of the tokens of this forward; then cleared
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch


class _StopForward(Exception):
    """Raised inside the deepest hooked layer to abandon the rest of the forward (caught by LayerCapture)."""


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """`model.model.layers` of a CausalLM, or `model.layers` of a bare base model."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no decoder layers at .model.layers or .layers")
    return layers


class LayerCapture:
    """Collected outputs of the hooked layers; one list entry per forward run inside the context."""

    def __init__(self, model: torch.nn.Module, layer_ids: Sequence[int], stop_after_deepest: bool):
        self.model = model
        self.layer_ids = sorted(int(i) for i in layer_ids)
        if len(set(self.layer_ids)) != len(self.layer_ids) or not self.layer_ids:
            raise ValueError(f"layer_ids must be non-empty and distinct, got {list(layer_ids)}")
        n = len(decoder_layers(model))
        if self.layer_ids[0] < 0 or self.layer_ids[-1] >= n:
            raise ValueError(f"layer ids {self.layer_ids} out of range for a model with {n} decoder layers "
                             f"(ids are 0-based decoder-layer outputs: 0..{n - 1})")
        self.stop_after_deepest = stop_after_deepest
        self.outputs: dict[int, list[torch.Tensor]] = {i: [] for i in self.layer_ids}

    def _hook(self, layer_id: int):
        deepest = layer_id == self.layer_ids[-1]

        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            self.outputs[layer_id].append(hidden.detach())
            if deepest and self.stop_after_deepest:
                raise _StopForward

        return hook

    def forward(self, **inputs: Any) -> None:
        """Run the base decoder stack (no lm_head, no cache) on `inputs`; results land in `self.outputs`."""
        base = getattr(self.model, "model", self.model)
        inputs.setdefault("use_cache", False)
        try:
            with torch.inference_mode():
                base(**inputs)
        except _StopForward:
            pass

    def features(self, clear: bool = True) -> torch.Tensor:
        """[..., T, n*H]: each layer's forwards concatenated along the sequence, layers along the hidden dim in
        increasing id order (the layout the drafter's fc expects)."""
        if any(not v for v in self.outputs.values()):
            raise RuntimeError("no forward has been captured yet")
        per_layer = [torch.cat(self.outputs[i], dim=-2) for i in self.layer_ids]
        if clear:
            self.clear()
        return torch.cat(per_layer, dim=-1)

    def clear(self) -> None:
        for v in self.outputs.values():
            v.clear()


@contextmanager
def capture_layers(model: torch.nn.Module, layer_ids: Sequence[int], stop_after_deepest: bool = False
                   ) -> Iterator[LayerCapture]:
    """Hook `model.model.layers[i]` for each id (DFlash convention: output of layer i == HF hidden_states[i+1]).

    With `stop_after_deepest`, call the model through `LayerCapture.forward`: a direct `model(...)` would see the
    private stop exception. Hooks are removed on exit, even after an error.
    """
    cap = LayerCapture(model, layer_ids, stop_after_deepest)
    layers = decoder_layers(model)
    handles = [layers[i].register_forward_hook(cap._hook(i)) for i in cap.layer_ids]
    try:
        yield cap
    finally:
        for h in handles:
            h.remove()
