"""The DFlash drafter: decoder layers (layers.py) that denoise a block `[x_anchor, MASK x (B-1)]` in one pass,
conditioned on fused target-layer features `hidden_norm(fc(concat(features of the n target layers)))` injected as
extra keys/values in every layer. DFlash2 (`geometry.kind`) adds block convolutions and a candidate selector.

Embedding and LM head are the target's, frozen (flashdraft/target/weights.py). They are non-persistent buffers, so
`state_dict()` holds exactly what training changes: the layers, `fc`, the norms, DFlash2's selector, the trainable
`mask_embedding` when the target has no mask token or free row (geometry.py `resolve_mask_token`), and `d2t` (the
draft vocabulary).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flashdraft.drafter.attention import BlockLayout
from flashdraft.drafter.dflash2 import CandidateSelector, candidate_scores, select_walk
from flashdraft.drafter.geometry import DrafterGeometry
from flashdraft.drafter.layers import ACTIVATION_CHECKPOINTING, DFlashLayer
from flashdraft.drafter.session import ContextCache, DraftSession
from flashdraft.perf.cpu_gemm import upcast_matmul


class DFlashDrafter(nn.Module):
    def __init__(self, geometry: DrafterGeometry, embed: torch.Tensor | None = None,
                 lm_head: torch.Tensor | None = None, attn_impl: str = "auto"):
        super().__init__()
        g = self.geometry = geometry
        self.attn_impl = attn_impl
        self.parent: Any = None  # pretrained.ParentIdentity when started from drafter.init_from (not saved)
        self.initialised_not_loaded: list[str] = []  # a DFlash parent's dflash2 drafter: its DFlash2-only tensors
        self.layers = nn.ModuleList(DFlashLayer(g, i) for i in range(g.num_layers))
        self.fc = nn.Linear(g.num_features * g.hidden_size, g.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.norm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(g.hidden_size)) if g.trainable_mask else None
        self.candidate_selector = (CandidateSelector(g.hidden_size, g.vocab_size, g.selector_rank, g.selector_top_k)
                                   if g.is_dflash2 else None)
        inv_freq = 1.0 / (g.rope_theta ** (torch.arange(0, g.head_dim, 2, dtype=torch.float64) / g.head_dim))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.register_buffer("embed_weight", embed if embed is not None else torch.empty(0), persistent=False)
        self.register_buffer("lm_head_weight", lm_head if lm_head is not None else torch.empty(0), persistent=False)
        K = g.draft_vocab_size
        self.register_buffer("d2t", torch.arange(K) if K else None)  # persistent: the draft vocabulary
        self.register_buffer("draft_head_weight", torch.empty(0), persistent=False)  # lm_head rows of d2t

    # -- construction ----------------------------------------------------------------------------------------
    def init_weights(self, seed: int, mask_init: str = "mean") -> None:
        """Seeded init (Qwen3 style: normal(0, initializer_range) linears, unit norms). The trainable mask embedding
        starts at the mean target embedding or at zero (`drafter.mask_init`; docs/training.md compares them)."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name == "mask_embedding" or name.startswith("candidate_selector.") or "_conv." in name:
                    continue
                if p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * self.geometry.initializer_range)
                else:
                    p.fill_(1.0)
            # DFlash2 parts start neutral (dflash2.py): identity convolutions, a selector that walks the argmax.
            # Drawn after the DFlash weights, so a dflash2 drafter's DFlash weights equal a dflash one's (same seed).
            for layer in self.layers:
                if layer.attention_conv is not None:
                    layer.attention_conv.reset_identity()
                    layer.mlp_conv.reset_identity()
            if self.candidate_selector is not None:
                self.candidate_selector.reset(gen, self.geometry.initializer_range)
            if self.mask_embedding is not None and self.embed_weight.numel():
                if mask_init == "zero":
                    self.mask_embedding.zero_()
                else:
                    self.mask_embedding.copy_(self.embed_weight.mean(0, dtype=torch.float32))

    def init_from_target(self, layers: list[dict[str, torch.Tensor]], final_norm: torch.Tensor | None) -> list[str]:
        """Start draft layer i from target decoder layer `layers[i]` and the final norm from the target's: same
        width, so a draft layer begins as a working transformer layer reading the target's own representation.
        Tensors with another name or shape (q/k norms a Llama target lacks, MoE experts, gated attention) keep
        their seeded init. Returns the names copied."""
        copied = []
        with torch.no_grad():
            for i, tensors in enumerate(layers):
                own = dict(self.layers[i].named_parameters())
                for name, t in tensors.items():
                    if name in own and tuple(own[name].shape) == tuple(t.shape):
                        own[name].copy_(t.float())
                        copied.append(f"layers.{i}.{name}")
            if final_norm is not None and tuple(final_norm.shape) == tuple(self.norm.weight.shape):
                self.norm.weight.copy_(final_norm.float())
                copied.append("norm.weight")
        return copied

    def set_activation_checkpointing(self, mode: str) -> None:
        """What the layers recompute in the backward (`training.activation_checkpointing`): none, mlp or layer.
        The results are identical; only memory and time change."""
        if mode not in ACTIVATION_CHECKPOINTING:
            raise ValueError(f"activation checkpointing {mode!r}: use one of {ACTIVATION_CHECKPOINTING}")
        for layer in self.layers:
            layer.recompute = mode

    def set_frozen(self, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        V, H = self.geometry.vocab_size, self.geometry.hidden_size
        for name, t in (("embed", embed), ("lm_head", lm_head)):
            if tuple(t.shape) != (V, H):
                raise ValueError(f"target {name} has shape {tuple(t.shape)}, expected ({V}, {H})")
        self.embed_weight = embed.detach().requires_grad_(False)
        self.lm_head_weight = lm_head.detach().requires_grad_(False)
        self.refresh_head()

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Use these target token ids (sorted, distinct, `draft_vocab_size` of them) as the draft vocabulary."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).flatten()
        K, V = self.geometry.draft_vocab_size, self.geometry.vocab_size
        if self.d2t is None or ids.numel() != K or ids.unique().numel() != K or ids.min() < 0 or ids.max() >= V:
            raise ValueError(f"draft vocabulary: need {K} distinct ids in 0..{V - 1}, got {ids.numel()}")
        self.d2t.copy_(ids.sort().values.to(self.d2t.device))
        self.refresh_head()

    def refresh_head(self) -> None:
        head = self.lm_head_weight
        if self.d2t is not None and head.numel():
            self.draft_head_weight = head[self.d2t.to(head.device)]

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head the drafter scores with: the target's, or its draft-vocabulary rows."""
        return self.lm_head_weight if self.d2t is None else self.draft_head_weight

    def target_to_draft(self) -> torch.Tensor:
        """[V] target id -> draft index, -1 where the token is outside the draft vocabulary."""
        t2d = torch.full((self.geometry.vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
        t2d[self.d2t] = torch.arange(self.d2t.numel(), device=self.d2t.device)
        return t2d

    # -- forward ---------------------------------------------------------------------------------------------
    def _cos_sin(self, positions: torch.Tensor):
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """[S, n*H] target features -> [S, H] fused context."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def block_inputs(self, anchor_tokens: torch.Tensor, block_size: int) -> torch.Tensor:
        """[N] anchor tokens -> [N, B, H] embeddings of `[x_anchor, MASK x (B-1)]`."""
        g = self.geometry
        anchor_emb = F.embedding(anchor_tokens, self.embed_weight).to(self.fc.weight.dtype)
        if self.mask_embedding is not None:
            mask_emb = self.mask_embedding.to(anchor_emb.dtype)
        else:
            mask_emb = self.embed_weight[g.mask_token_id].to(anchor_emb.dtype)
        mask_part = mask_emb.expand(anchor_tokens.numel(), block_size - 1, g.hidden_size)
        return torch.cat([anchor_emb[:, None, :], mask_part], dim=1)

    def forward(self, features: torch.Tensor, layout: BlockLayout, context_positions: torch.Tensor,
                anchor_tokens: torch.Tensor, anchor_positions: torch.Tensor) -> torch.Tensor:
        """All blocks of one packed row in one pass -> final-normed hidden states [N, B, H].

        features [S, n*H] and context_positions [S] (RoPE position of each context entry, per document);
        anchor_tokens/anchor_positions [N]; `layout` says which context each block may see."""
        B, N = layout.block_size, layout.num_blocks
        ctx = self.fuse(features)[None]
        x = self.block_inputs(anchor_tokens, B).reshape(1, N * B, -1)
        block_pos = (anchor_positions[:, None] + torch.arange(B, device=anchor_positions.device)).reshape(-1)
        rope_q = self._cos_sin(block_pos)
        rope_kv = self._cos_sin(torch.cat([context_positions, block_pos]))
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_kv, layout, self.attn_impl)
        return self.norm(x.view(N, B, -1))  # norm last: the output is not a view (FSDP2 hooks need that)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target-vocabulary logits; with a draft vocabulary, tokens outside it get -inf (never drafted)."""
        scores = upcast_matmul(hidden, self.head_weight)
        if self.d2t is None:
            return scores
        full = scores.new_full((*scores.shape[:-1], self.geometry.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.d2t, scores)

    # -- inference API ---------------------------------------------------------------------------------------
    def draft_logits(self, context_features: torch.Tensor, last_token: int,
                     block_size: int | None = None) -> torch.Tensor:
        """[B-1, V] logits of the draft slots after the verified sequence x_0..x_S (see `draft_hidden`)."""
        return self.logits(self.draft_hidden(context_features, last_token, block_size))

    @torch.no_grad()
    def draft_hidden(self, context_features: torch.Tensor, last_token: int,
                     block_size: int | None = None) -> torch.Tensor:
        """[B-1, H] final-normed states of the draft slots after x_0..x_S, recomputing the whole context.

        context_features [S, n*H] are the target features of x_0..x_{S-1}; `last_token` is x_S (no feature yet).
        The block `[x_S, MASK x (B-1)]` sits at positions S..S+B-1, sees all S context positions and itself."""
        B = block_size or self.geometry.block_size
        dev = self.fc.weight.device
        feats = context_features.to(dev)
        S = feats.shape[0]
        layout = BlockLayout(S, B, torch.tensor([S], device=dev))
        hidden = self(feats, layout, torch.arange(S, device=dev), torch.tensor([int(last_token)], device=dev),
                      torch.tensor([S], device=dev))
        return hidden[0, 1:]

    def propose_block(self, context_features: torch.Tensor, last_token: int,
                      block_size: int | None = None) -> torch.Tensor:
        """Greedy draft of B-1 tokens (DFlash: argmax; DFlash2: the selector walk)."""
        return self.propose_from_hidden(self.draft_hidden(context_features, last_token, block_size), last_token)

    @torch.no_grad()
    def propose_from_hidden(self, hidden: torch.Tensor, last_token: int) -> torch.Tensor:
        """Slot states [B-1, H] -> the B-1 greedy drafts."""
        if self.candidate_selector is None:
            return self.logits(hidden).argmax(-1)
        return select_walk(*self.candidates(hidden, last_token))

    @torch.no_grad()
    def propose_batch(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """Drafts of many blocks at once: slot states [N, B-1, H], anchor tokens [N] -> [N, B-1]."""
        if self.candidate_selector is None:
            return self.logits(hidden).argmax(-1)
        return select_walk(*candidate_scores(self.candidate_selector, hidden, self.head_weight, anchor_tokens))

    @torch.no_grad()
    def candidates(self, hidden: torch.Tensor, last_token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """DFlash2: (top-k candidate ids [B-1, k], selector scores [B-1, k, k]) of one block (dflash2.py)."""
        return candidate_scores(self.candidate_selector, hidden, self.head_weight, int(last_token))

    @torch.no_grad()
    def extend_context(self, cache: ContextCache | None, features: torch.Tensor) -> ContextCache:
        """Append the features [T, n*H] of the next T verified positions to `cache` (None: a new one): fuse them
        and project them with every layer's k_proj/v_proj (+ k_norm, RoPE at their positions) once, instead of
        redoing the whole context every draft cycle. Row by row the same arithmetic as `forward`."""
        dev = self.fc.weight.device
        start = cache.length if cache is not None else 0
        ctx = self.fuse(features.to(dev))[None]
        rope = self._cos_sin(torch.arange(start, start + ctx.shape[1], device=dev))
        new = [layer.self_attn.project_kv(ctx, rope) for layer in self.layers]
        if cache is None:
            return ContextCache([k for k, _ in new], [v for _, v in new], ctx.shape[1])
        return ContextCache([torch.cat([old, k], dim=2) for old, (k, _) in zip(cache.keys, new, strict=True)],
                            [torch.cat([old, v], dim=2) for old, (_, v) in zip(cache.values, new, strict=True)],
                            start + ctx.shape[1])

    @torch.no_grad()
    def cached_draft_hidden(self, cache: ContextCache, last_token: int, block_size: int | None = None
                            ) -> torch.Tensor:
        """`draft_hidden` over a ContextCache: only the B block slots run through the layers."""
        B = block_size or self.geometry.block_size
        dev = self.fc.weight.device
        S = cache.length
        layout = BlockLayout(S, B, torch.tensor([S], device=dev))
        x = self.block_inputs(torch.tensor([int(last_token)], device=dev), B)
        rope = self._cos_sin(torch.arange(S, S + B, device=dev))
        for layer, k, v in zip(self.layers, cache.keys, cache.values, strict=True):
            x = layer(x, None, rope, rope, layout, self.attn_impl, (k, v))
        return self.norm(x)[0, 1:]

    def new_session(self, cached: bool = True) -> DraftSession:
        """Per-sequence drafting state for speculative decoding (spec.py's Proposer protocol)."""
        return DraftSession(self, cached)

    # -- state to save (persistence.py) ------------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        return asdict(self.geometry)

    def weights(self) -> dict[str, torch.Tensor]:
        """Trainable tensors by z-lab name, contiguous fp32 on CPU."""
        return {k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().contiguous()
                for k, v in self.state_dict().items()}
