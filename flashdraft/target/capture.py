"""Capture the target's intermediate hidden states for DFlash, and only those.

Layer-id convention (z-lab DFlash, used everywhere in flashdraft): id ``i`` is the OUTPUT of the 0-based decoder
layer ``model.model.layers[i]`` (``model.model.language_model.layers[i]`` in a multimodal wrapper; linear-attention
layers of hybrid targets count like any other) = HF ``hidden_states[i + 1]``; vLLM / speculators "aux hidden state
layer" ids are ``i + 1``. Off by one silently ruins acceptance (docs/shard-format.md).

Why hooks instead of ``output_hidden_states``: that flag keeps every layer's states alive and still runs the final
norm, lm_head and [T, vocab] logits. Hooks keep only the configured layers, and with ``stop_after_deepest=True``
the deepest one raises a private exception that `LayerCapture.forward` swallows, so nothing deeper runs::

    with capture_layers(model, [1, 8, 14, 20, 27], stop_after_deepest=True) as cap:
        cap.forward(input_ids=ids, position_ids=pos)        # runs model.model (no lm_head), stops at layer 27
        feats = cap.features()                               # [B, T, 5 * H], ids in increasing order

    with capture_layers(model, ids) as cap:                  # evaluation: full forwards with logits and a KV cache
        out = model(input_ids=ids, cache=cache, use_cache=True)
        ctx = cap.features()                                 # features of the tokens of this forward; then cleared
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from flashdraft.target.model import UnsupportedTargetError


class _StopForward(Exception):
    """Raised inside the deepest hooked layer to abandon the rest of the forward (caught by LayerCapture)."""


# Where architectures keep their decoder stack, relative to the loaded model, and which module's forward runs it:
# CausalLM (`model.layers`, run `model`), a multimodal wrapper such as Qwen3_5ForConditionalGeneration
# (`model.language_model.layers`, run `model`, which embeds and feeds its language model), bare base models.
DECODER_PATHS = (("model.layers", "model"), ("model.language_model.layers", "model"),
                 ("language_model.model.layers", "language_model.model"), ("language_model.layers", "language_model"),
                 ("layers", ""))


def module_at(obj: object, path: str) -> object | None:
    for name in filter(None, path.split(".")):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def decoder_stack(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
    """(the module whose forward runs the decoder stack without the LM head, its layer list), wherever the
    architecture keeps them. Raises UnsupportedTargetError naming the model class and every path looked at."""
    for layers_path, runner_path in DECODER_PATHS:
        layers, runner = module_at(model, layers_path), module_at(model, runner_path)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0 and isinstance(runner, torch.nn.Module):
            return runner, layers
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or "?"
    raise UnsupportedTargetError(
        f"{type(model).__name__} ({name}): no decoder layers found; flashdraft captures hidden states from a "
        f"non-empty torch.nn.ModuleList at one of {', '.join('.' + p for p, _ in DECODER_PATHS)}")


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layer list (see `decoder_stack`)."""
    return decoder_stack(model)[1]


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
        base = decoder_stack(self.model)[0]
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
