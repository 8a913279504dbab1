"""The target's cache during speculative decoding: after each verify forward it must hold exactly the accepted
prefix, never the rejected drafts.

* Attention-only targets: crop the rejected positions off the KV cache (cheap, exact).
* Sliding-window layers (gpt-oss, Mistral-style): past the window the verify forward has already pushed accepted
  keys out, so the layer cannot be cropped. Its keys/values are remembered before the verify forward (references:
  `update` replaces the tensors, never writes into them) and afterwards set to those plus the block's accepted
  ones, cut to the window. Attention sinks are learned logits, not cached state.
* Hybrid targets (Qwen3.5/3.6 Gated DeltaNet): a recurrent state has folded every verified token in. Its
  fixed-size recurrent and conv states are snapshotted before the verify forward; on a partial acceptance they
  are restored, the attention layers cropped to the same point and the accepted tokens re-forwarded (one decoder
  forward of at most `block_size` tokens, no LM head); a full acceptance redoes nothing.
Every path leaves exactly what a forward of the accepted tokens leaves, and the committed tokens still come from
the verify forward's logits. Why not the alternatives: docs/configuration.md ("Qwen3.5/3.6 (hybrid) targets").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _linear_layer_cls():
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    return LinearAttentionCacheLayerMixin


def croppable(cache) -> bool:
    """Whether rejected positions can be cut from this cache. Linear-attention (recurrent) layers, as in the
    hybrid Qwen3.5/3.6 targets, fold every token into their state, so they cannot roll back."""
    linear = _linear_layer_cls()
    return not any(isinstance(layer, linear) for layer in getattr(cache, "layers", []))


def _sliding(layer) -> bool:
    """A dynamic sliding-window attention layer (keeps its last W-1 keys; its own `crop` fails past W)."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    return isinstance(layer, DynamicSlidingWindowLayer) and not isinstance(layer, _linear_layer_cls())


@dataclass
class _Window:
    """A sliding-window layer before a verify forward: its tensors (references) and its token count."""

    keys: torch.Tensor | None
    values: torch.Tensor | None
    length: int


@dataclass
class _Saved:
    conv: dict[int, torch.Tensor | None]
    recurrent: dict[int, torch.Tensor | None]
    length: torch.Tensor | None  # the layer's token count (transformers >= 5.25 keeps one per linear layer)


# Where transformers >= 5.25 counts a linear layer's tokens; `get_seq_length()` reads it from layer 0, which is a
# linear layer in Qwen3.5/3.6, so a rewind that left it behind would shift every later position.
LINEAR_LENGTH = "cumulative_length_linear"


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _snapshot(layer) -> _Saved:
    """Copies of one linear-attention layer's fixed-size state."""
    return _Saved(conv={k: _clone(v) for k, v in layer.conv_states.items()},
                  recurrent={k: _clone(v) for k, v in layer.recurrent_states.items()},
                  length=_clone(getattr(layer, LINEAR_LENGTH, None)))


class VerifyCache:
    """Wraps the target's cache for verify forwards: `checkpoint()` before each, `keep()` after it."""

    def __init__(self, model, cache):
        self.model = model
        self.cache = cache
        self.croppable = croppable(cache)
        self._saved: dict[int, _Saved] = {}
        self._windows: dict[int, _Window] = {}
        self.reforwarded_tokens = 0  # extra target tokens run to roll recurrent layers back (hybrid targets, or a
        # block wider than a sliding window)

    def checkpoint(self) -> None:
        """Remember the recurrent/conv state of every linear-attention layer and the keys of every sliding-window
        layer (no-op for full-attention caches)."""
        self._windows = {i: _Window(layer.keys if layer.is_initialized else None,
                                    layer.values if layer.is_initialized else None, layer.cumulative_length)
                         for i, layer in enumerate(getattr(self.cache, "layers", [])) if _sliding(layer)}
        if self.croppable:
            return
        linear = _linear_layer_cls()
        self._saved = {i: _snapshot(layer) for i, layer in enumerate(self.cache.layers) if isinstance(layer, linear)}

    def keep(self, block: torch.Tensor, keep: int, capture=None) -> None:
        """After verifying `block` (1-D ids), keep its first `keep` tokens in the cache. `capture` (a LayerCapture)
        is cleared of the re-forward's features, which duplicate the verify forward's."""
        drop = block.numel() - keep
        if drop == 0:
            return
        # A sliding layer still holds the whole block unless the block is wider than its window (then rewind).
        spliceable = all(block.numel() <= self.cache.layers[i].keys.shape[-2] for i in self._windows)
        if self.croppable and spliceable:
            for i, layer in enumerate(self.cache.layers):
                if i in self._windows:
                    self._keep_window(layer, self._windows[i], block.numel(), keep)
                else:
                    layer.crop(-drop)
            return
        self._rewind(block.numel())
        with torch.inference_mode():  # the decoder alone: only the cache is wanted, not a vocab-wide LM head row
            self.model.base_model(input_ids=block[:keep][None], cache=self.cache, use_cache=True)
        self.reforwarded_tokens += keep
        if capture is not None:
            capture.clear()

    def discard(self, verified: int) -> None:
        """Undo the forward of `verified` tokens since `checkpoint()` (the cost measurement's forwards, whose
        tokens are not part of any sequence)."""
        self._rewind(verified)

    @staticmethod
    def _keep_window(layer, before: _Window, verified: int, keep: int) -> None:
        """The sliding-window layer as a forward of the `keep` accepted tokens after `before` leaves it: its
        remembered keys, then the first `keep` of the block's (the last `verified` it holds), the last W-1 kept."""
        new = slice(layer.keys.shape[-2] - verified, layer.keys.shape[-2] - verified + keep)
        keys, values = layer.keys[..., new, :], layer.values[..., new, :]
        if before.keys is not None:
            keys, values = torch.cat([before.keys, keys], dim=-2), torch.cat([before.values, values], dim=-2)
        layer.keys, layer.values = keys[..., -layer.sliding_window + 1:, :], values[..., -layer.sliding_window + 1:, :]
        layer.cumulative_length = before.length + keep

    def _rewind(self, verified: int) -> None:
        """Cache back to its state before the verify forward of `verified` tokens."""
        from transformers.cache_utils import DynamicLayer

        linear = _linear_layer_cls()
        for i, layer in enumerate(self.cache.layers):
            if isinstance(layer, linear):
                saved = self._saved[i]
                for k, v in saved.conv.items():
                    layer.conv_states[k] = v
                for k, v in saved.recurrent.items():
                    layer.recurrent_states[k] = v
                if saved.length is not None:
                    getattr(layer, LINEAR_LENGTH).copy_(saved.length)  # in place: the cache may pin its address
            if i in self._windows:  # a sliding-window layer: back to its remembered tensors
                before = self._windows[i]
                layer.keys, layer.values, layer.cumulative_length = before.keys, before.values, before.length
                if before.keys is None:
                    layer.is_initialized = False
            elif isinstance(layer, DynamicLayer):  # attention part (also of a mixed linear + attention layer)
                DynamicLayer.crop(layer, -verified)
