"""FLOPs of the target's forward while it generates, counted from its shapes the way flashdraft/perf/flops.py
counts the drafter's: 2 per weight of every linear layer below the LM head for each token fed in, the LM head
(2 x its weights) for each token whose logits are taken, and attention 4 x head_dim x heads per (query, key) pair
per layer (QK^T and PV). Why: divided by the generation seconds and this CPU's measured GEMM rate
(flashdraft/perf/cpu_gemm.py `measure_gemm_flops`) it says how far from the machine's limit generation runs (the
stage's `gemm_share`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ForwardCost:
    """Per-token and per-pair FLOPs of one target."""

    linear_per_token: float     # 2 x the linear weights of the decoder layers (and any other linear below the head)
    head_per_token: float       # 2 x the LM head's weights
    attention_per_pair: float   # 4 x head_dim x attention heads x attention layers

    @classmethod
    def of(cls, model) -> ForwardCost:
        import torch

        head = model.get_output_embeddings()
        linear = sum(m.weight.numel() for m in model.modules()
                     if isinstance(m, torch.nn.Linear) and m is not head)
        text = model.config.get_text_config(decoder=True)
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        types = getattr(text, "layer_types", None)
        layers = sum(t != "linear_attention" for t in types) if types else text.num_hidden_layers
        return cls(2.0 * linear, 2.0 * head.weight.numel(), 4.0 * head_dim * heads * layers)

    def reply(self, prompt_len: int, reply_len: int) -> float:
        """FLOPs of answering a `prompt_len`-token prompt with `reply_len` tokens: the prompt and every reply token
        but the last are fed in, each attending to itself and everything before it; each reply token's logits."""
        fed = prompt_len + max(reply_len - 1, 0)
        return (self.linear_per_token * fed + self.head_per_token * reply_len
                + self.attention_per_pair * fed * (fed + 1) / 2)
