"""The target's cache during speculative decoding: after each verify forward it must hold exactly the accepted
prefix, never the rejected drafts.

* Attention-only targets: crop the rejected positions off the KV cache (cheap, exact).
* Hybrid targets (Qwen3.5/3.6: Gated DeltaNet layers with a recurrent state and a causal-conv window, plus gated
  full-attention layers): a recurrent state has folded every verified token in and cannot be cropped. So before
  the verify forward the recurrent and conv states are snapshotted (copies of fixed-size tensors: no sequence
  dimension, so the cost does not grow with context). On a partial acceptance the states are restored, the
  attention layers cropped back to the same point, and the accepted tokens re-forwarded: the cache is then what
  a forward of exactly the accepted tokens produces. On a full acceptance the verify forward already left the
  right state and nothing is redone.

Why this and not the alternatives: re-running the whole sequence each cycle (the earlier fallback) is exact but
quadratic in the context; per-token intermediate states would need the chunked delta-rule kernel to emit them
(vLLM's GPU kernels do, transformers' reference does not). Snapshot + re-forward costs one extra decoder forward
(no LM head: with a 248k vocabulary that row alone is a large share of a tiny target's step) of at most
`block_size` tokens per partially accepted cycle and is exact: the committed tokens still come from the
verify forward's logits, and the lossless check compares them with a plain decode.
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
        self.reforwarded_tokens = 0  # extra target tokens run to roll recurrent layers back (hybrid targets)

    def checkpoint(self) -> None:
        """Remember the recurrent/conv state of every linear-attention layer (no-op for attention-only caches)."""
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
        if self.croppable:
            self.cache.crop(-drop)
            return
        self._rewind(block.numel())
        with torch.inference_mode():  # the decoder alone: only the cache is wanted, not a vocab-wide LM head row
            self.model.base_model(input_ids=block[:keep][None], cache=self.cache, use_cache=True)
        self.reforwarded_tokens += keep
        if capture is not None:
            capture.clear()

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
            if isinstance(layer, DynamicLayer):  # attention part (also of a mixed linear + attention layer)
                DynamicLayer.crop(layer, -verified)
