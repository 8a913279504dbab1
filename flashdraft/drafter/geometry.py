"""The drafter's geometry: every shape and option of a DFlash/DFlash2 drafter (saved as drafter_config.json),
derived from the target's config, and the choice of the mask token.

Width is the target's (the drafter uses the target's embedding and LM head as they are); heads, kv heads,
head_dim and MLP width default to the target's and may differ. Each layer is full or sliding-window attention
(`layer_types`, `sliding_window`; attention.py defines the window as vLLM applies it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flashdraft.config import ConfigError
from flashdraft.target.model import text_config

FULL, SLIDING = "full_attention", "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@dataclass
class DrafterGeometry:
    """Everything that fixes the drafter's shapes and behaviour; serialised as drafter_config.json."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    vocab_size: int
    num_layers: int
    block_size: int
    target_layer_ids: list[int]
    num_target_layers: int
    mask_token_id: int
    trainable_mask: bool = False
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    target: dict[str, Any] = field(default_factory=dict)  # TargetConfig dump: where embed/lm_head come from
    # Per draft layer "full_attention" or "sliding_attention" (None: all full); the window W of the sliding ones
    # (attention.py's docstring says what W means; vLLM reads the same two fields from config.json).
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    # Reduced draft vocabulary (EAGLE-3 / SpecForge style): the drafter scores only these many target tokens; the
    # `d2t` buffer (draft index -> target id) is saved with the weights. None: the whole target vocabulary.
    draft_vocab_size: int | None = None
    # "dflash" or "dflash2" (dflash2.py: block convolutions + candidate selector; the four fields below are its
    # vLLM dflash_config keys and are None for dflash).
    kind: str = "dflash"
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None

    def __post_init__(self):
        if self.kind not in ("dflash", "dflash2"):
            raise ValueError(f"drafter kind {self.kind!r}: use 'dflash' or 'dflash2'")
        if self.kind == "dflash2":
            extra = {k: getattr(self, k) for k in DFLASH2_FIELDS}
            if None in extra.values():
                raise ValueError(f"dflash2 drafter: every one of {DFLASH2_FIELDS} is required, got {extra}")
            if self.hidden_size % self.conv_group_size:
                raise ValueError(f"drafter.conv_group_size={self.conv_group_size} does not divide hidden size "
                                 f"{self.hidden_size}")
            if self.draft_vocab_size is not None:
                raise ValueError("dflash2 drafter: a reduced draft vocabulary is not supported")
        if self.layer_types is not None:
            bad = [t for t in self.layer_types if t not in LAYER_TYPES]
            if len(self.layer_types) != self.num_layers or bad:
                raise ValueError(f"drafter layer_types {self.layer_types}: need {self.num_layers} entries from "
                                 f"{LAYER_TYPES}")
            if SLIDING in self.layer_types and (self.sliding_window is None or self.sliding_window < 1):
                raise ValueError(f"drafter layer_types has {SLIDING!r} layers but sliding_window is "
                                 f"{self.sliding_window}; set drafter.sliding_window >= 1")

    @property
    def is_dflash2(self) -> bool:
        return self.kind == "dflash2"

    @property
    def num_features(self) -> int:
        return len(self.target_layer_ids)

    def window(self, layer: int) -> int | None:
        """The sliding window of draft layer `layer`, None for full attention."""
        if self.layer_types is not None and self.layer_types[layer] == SLIDING:
            return self.sliding_window
        return None


def rope_theta_of(hf_config) -> float:
    c = text_config(hf_config)
    theta = getattr(c, "rope_theta", None)
    if theta is None:
        params = getattr(c, "rope_parameters", None) or {}
        theta = params.get("rope_theta")
    if theta is None:
        raise ValueError("target config has neither rope_theta nor rope_parameters.rope_theta")
    return float(theta)


def geometry_from_hf(hf_config, *, num_layers: int, block_size: int, target_layer_ids: list[int],
                     mask_token_id: int, trainable_mask: bool, target: dict[str, Any] | None = None,
                     hidden_size: int | None = None, num_heads: int | None = None, num_kv_heads: int | None = None,
                     head_dim: int | None = None, intermediate_size: int | None = None,
                     layer_types: list[str] | None = None, sliding_window: int | None = None) -> DrafterGeometry:
    """RoPE theta and eps from the target; width, heads, kv heads, head_dim and MLP width from the target unless
    given (`DrafterConfig.geometry_overrides`: the published Qwen3.5/3.6-27B drafters use their own head layout).

    The width cannot differ from the target's: the drafter embeds with the target's frozen embedding, decodes
    with its LM head, and vLLM shares both with the target, so `hidden_size` only restates it."""
    c = text_config(hf_config)
    if hidden_size is not None and hidden_size != int(c.hidden_size):
        raise ConfigError(f"drafter.hidden_size {hidden_size} != target hidden size {c.hidden_size} (the drafter "
                          "uses the target's embedding and LM head: unset it to follow the target)")
    target_heads = int(c.num_attention_heads)
    heads = int(num_heads or target_heads)
    kv_heads = int(num_kv_heads or getattr(c, "num_key_value_heads", None) or target_heads)
    if heads % kv_heads:
        raise ConfigError(f"drafter.num_kv_heads={kv_heads} does not divide drafter.num_heads={heads}; set both")
    head_dim = head_dim or (getattr(c, "head_dim", None) or c.hidden_size // target_heads)
    return DrafterGeometry(
        hidden_size=int(c.hidden_size), num_heads=heads, num_kv_heads=kv_heads, head_dim=int(head_dim),
        intermediate_size=int(intermediate_size or c.intermediate_size), rope_theta=rope_theta_of(c),
        rms_norm_eps=float(c.rms_norm_eps), vocab_size=int(c.vocab_size), num_layers=num_layers,
        block_size=block_size, target_layer_ids=list(target_layer_ids), num_target_layers=int(c.num_hidden_layers),
        mask_token_id=int(mask_token_id), trainable_mask=trainable_mask,
        max_position_embeddings=int(getattr(c, "max_position_embeddings", 32768) or 32768),
        initializer_range=float(getattr(c, "initializer_range", 0.02) or 0.02), target=dict(target or {}),
        layer_types=list(layer_types) if layer_types is not None else None,
        sliding_window=int(sliding_window) if sliding_window is not None else None,
    )


def resolve_mask_token(explicit: int | None, tokenizer, vocab_size: int) -> tuple[int, bool]:
    """(mask_token_id, trainable). Order: explicit id, the tokenizer's mask token, the first embedding row past
    the tokenizer's vocabulary (unused by any text), else a trainable embedding with the pad (or eos) id as the
    placeholder row that serving stacks replace."""
    if explicit is not None:
        if not 0 <= explicit < vocab_size:
            raise ValueError(f"drafter.mask_token_id={explicit} is outside the target vocabulary (0..{vocab_size - 1})")
        return int(explicit), False
    if tokenizer is not None and getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id), False
    if tokenizer is not None and len(tokenizer) < vocab_size:
        return len(tokenizer), False
    placeholder = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    if placeholder is None and tokenizer is not None:
        placeholder = tokenizer.eos_token_id
    return int(placeholder or 0), True
