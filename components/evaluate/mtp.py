"""The target's own multi-token-prediction head (Qwen3.5/3.6 `mtp.*` tensors) as a proposer: vLLM's
`{"method": "mtp"}`, decoded by flashdraft's speculative decoder.

The head (the checkpoint's `mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.N.*`, a
full-attention decoder layer, and `mtp.norm`; the embedding and LM head are the target's) predicts the token after
next: at position i it reads the target's final hidden state h_i (after the final norm) and the embedding of the
token x_{i+1}, and its normed output gives x_{i+2}'s logits through the target's LM head. Drafting is recursive, as
vLLM's MTP proposer does with one MTP layer: draft j + 1 reads the head's own output at draft j and the embedding
of draft j. The head keeps its own KV cache of the verified positions; a cycle's drafts are cropped from it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import torch
from torch import nn

MTP_PREFIX = "mtp."
SUPPORTED = ("qwen3_5_text", "qwen3_5")  # the dense Qwen3.5/3.6 layout transformers' layer classes rebuild


class MtpError(ValueError):
    """A target whose MTP head cannot be drafted with (one line naming why)."""


def mtp_layer_count(names: list[str]) -> int:
    """How many MTP decoder layers the checkpoint's `mtp.layers.N.*` names hold."""
    found = {int(m.group(1)) for n in names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))}
    return max(found) + 1 if found else 0


class MtpHead(nn.Module):
    """fc over [norm(embedding), norm(hidden)], the MTP decoder layer(s) and the final norm, named as the
    checkpoint's `mtp.*` tensors (without the prefix), built from transformers' own Qwen3.5 layer classes."""

    def __init__(self, text_config, num_layers: int = 1):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        if text_config.model_type not in SUPPORTED:
            raise MtpError(f"mtp: the {text_config.model_type} MTP layout is not built (dense Qwen3.5/3.6 only)")
        cfg = copy.deepcopy(text_config)
        cfg.layer_types, cfg.num_hidden_layers = ["full_attention"] * num_layers, num_layers
        self.config, hidden, eps = cfg, cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(Qwen3_5DecoderLayer(cfg, i) for i in range(num_layers))
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache,
                rotary: nn.Module, step: int = 0) -> torch.Tensor:
        """[1, T, H] normed outputs for inputs at `positions` [T] (the head's cache extended by T)."""
        from transformers.masking_utils import create_causal_mask

        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        pos = positions.view(1, -1)
        mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None, cache=cache,
                                  position_ids=pos)
        rope = rotary(x, pos[None].expand(3, 1, -1))  # multimodal rope: the text positions on every axis
        x = self.layers[step % len(self.layers)](x, position_embeddings=rope, attention_mask=mask,
                                                 position_ids=pos, cache=cache)
        return self.norm(x)


def _language_model(model: nn.Module) -> nn.Module:
    inner = model.model
    return getattr(inner, "language_model", inner)


@dataclass
class MtpSession:
    """One sequence: the verified token ids, the target hidden states not yet fed to the head, the head's cache."""

    proposer: MtpProposer
    cache: object
    tokens: list[int] = field(default_factory=list)
    pending: list[torch.Tensor] = field(default_factory=list)  # [n, H] final hidden states of verified positions
    fed: int = 0                                               # positions the head's cache holds
    head_out: torch.Tensor | None = None                       # its output at the newest fed position

    def extend(self, features: torch.Tensor, tokens: torch.Tensor | None = None) -> None:
        if tokens is None:
            raise ValueError("the MTP head needs the verified token ids: the decoder passed none")
        self.pending.append(self.proposer.final_norm(features))
        self.tokens.extend(int(t) for t in tokens.reshape(-1).tolist())

    @torch.inference_mode()
    def propose(self, last_token: int, num_drafts: int | None = None) -> torch.Tensor:
        p, k = self.proposer, self.proposer.max_drafts if num_drafts is None else num_drafts
        if self.pending:  # h_i with x_{i+1}: the verified tokens after each, then the newest token
            hidden = torch.cat(self.pending)[None]
            nxt = torch.tensor([*self.tokens[self.fed + 1:], int(last_token)], device=hidden.device)
            positions = torch.arange(self.fed, self.fed + hidden.shape[1], device=hidden.device)
            self.head_out = p.head(p.embed(nxt)[None], hidden, positions, self.cache, p.rotary)[:, -1:]
            self.fed, self.pending = self.fed + hidden.shape[1], []
        drafts, out = [], self.head_out
        for j in range(k):
            drafts.append(int(p.lm_head(out)[0, -1].argmax()))
            if j + 1 < k:  # the head's own output and its draft give the next draft
                pos = torch.tensor([self.fed + j], device=out.device)
                out = p.head(p.embed(torch.tensor([[drafts[-1]]], device=out.device)), out, pos, self.cache,
                             p.rotary, step=j + 1)
        extra = self.cache.get_seq_length() - self.fed
        if extra:
            self.cache.crop(-extra)  # this cycle's drafts leave the head's cache
        return torch.tensor(drafts, dtype=torch.long)


class MtpProposer:
    """The target's MTP head with its shared embedding, LM head, final norm and rotary embedding. It reads the
    output of the target's last decoder layer (`reads_layers`), the final norm applied here."""

    def __init__(self, model: nn.Module, weights: dict[str, torch.Tensor], max_drafts: int):
        lm = _language_model(model)
        text_config = model.config.get_text_config()
        param = next(model.parameters())
        names = [n[len(MTP_PREFIX):] for n in weights]
        self.head = MtpHead(text_config, mtp_layer_count(list(weights))).to(param.device, param.dtype).eval()
        missing, unexpected = self.head.load_state_dict(
            {n: weights[MTP_PREFIX + n].to(param.dtype) for n in names}, strict=False)
        if missing or unexpected:
            raise MtpError(f"mtp: the checkpoint's mtp.* tensors do not match the Qwen3.5 MTP layout (missing "
                           f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
        self.embed, self.lm_head = model.get_input_embeddings(), model.get_output_embeddings()
        self.final_norm, self.rotary = lm.norm, lm.rotary_emb
        self.max_drafts = max_drafts
        self.reads_layers = [text_config.num_hidden_layers - 1]

    def new_session(self) -> MtpSession:
        from transformers import DynamicCache

        return MtpSession(self, DynamicCache(config=self.head.config))

    @staticmethod
    def speculative_config(num_drafts: int) -> dict:
        return {"method": "mtp", "num_speculative_tokens": num_drafts}


def load_mtp_proposer(model: nn.Module, model_dir, revision: str | None, max_drafts: int) -> MtpProposer:
    """The target's MTP head from its checkpoint's `mtp.*` tensors (only the shards that hold them are read)."""
    from flashdraft.target.weights import read_tensors

    weights = read_tensors(model_dir, revision, lambda n: n.startswith(MTP_PREFIX))
    if not weights:
        raise MtpError(f"mtp: {model_dir} ships no mtp.* weights (no MTP head to draft with)")
    return MtpProposer(model, weights, max_drafts)
