"""The DFlash drafter: Qwen3-style decoder layers that denoise a block `[x_anchor, MASK x (B-1)]` in one pass,
conditioned on fused target-layer features injected as extra keys/values in every layer.

* Fusion: `hidden_norm(fc(concat(features of the n target layers)))`, fc = Linear(n*H -> H, no bias).
* KV injection: each layer projects the fused context with its OWN k_proj/v_proj (+ k_norm, RoPE at the context
  positions) and puts it before the block's keys/values; queries come from block tokens only.
* Embedding and LM head are the target's, frozen, read straight from its safetensors (never the whole target).
  They are non-persistent buffers, so `state_dict()` holds exactly what training changes.
* Geometry: width = the target's (its embedding and LM head are used as they are); heads, kv heads, head_dim and
  MLP width default to the target's and may differ (DrafterConfig). Each layer is full or sliding-window attention
  (`layer_types`, `sliding_window`; attention.py defines the window as vLLM applies it).
* Mask token: explicit id -> the tokenizer's mask token -> an unused row of the target embedding -> a trainable
  `mask_embedding` parameter (saved with the checkpoint; `mask_token_id` then names a placeholder row).

Files of a drafter folder (`save_pretrained`): `drafter_config.json` (geometry + target reference) and
`model.safetensors` (trainable weights, z-lab names: `layers.*`, `fc.weight`, `hidden_norm.weight`, `norm.weight`,
plus `mask_embedding` when trainable).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from flashdraft.cpu_gemm import upcast_matmul
from flashdraft.drafter.attention import BlockLayout, attend
from flashdraft.drafter.dflash2 import BlockConv, CandidateSelector, candidate_scores, select_walk
from flashdraft.target import text_config

log = logging.getLogger(__name__)

CONFIG_FILE = "drafter_config.json"
WEIGHTS_FILE = "model.safetensors"
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
    from flashdraft.config import ConfigError

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


# -- frozen target tensors -----------------------------------------------------------------------------------


def _is_embedding(name: str) -> bool:
    return name.endswith(("embed_tokens.weight", "lm_head.weight"))


def _weight_files(model_dir, revision: str | None, wanted=_is_embedding) -> dict[str, Path]:
    """Map tensor name -> local safetensors file for the names `wanted` accepts, downloading only the index and
    the shards they live in (hf ids)."""
    local = Path(str(model_dir))
    if local.is_dir():
        def fetch(name: str) -> Path | None:
            p = local / name
            return p if p.is_file() else None
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        def fetch(name: str) -> Path | None:
            try:
                return Path(hf_hub_download(str(model_dir), name, revision=revision))
            except EntryNotFoundError:
                return None
    index = fetch("model.safetensors.index.json")
    if index is not None:
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: fetch(v) for k, v in weight_map.items() if wanted(k)}
    single = fetch("model.safetensors")
    if single is None:
        raise FileNotFoundError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    from safetensors import safe_open

    with safe_open(str(single), "pt") as f:
        return {k: single for k in f.keys() if wanted(k)}


def _pick(names: list[str], suffix: str) -> str | None:
    found = sorted((n for n in names if n.endswith(suffix)), key=lambda n: ("mtp" in n or "draft" in n, len(n)))
    return found[0] if found else None


SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def mmap_tensor(path: Path, name: str) -> torch.Tensor:
    """Tensor `name` of a safetensors file as a copy-on-write view of the file's pages, in the file's dtype.

    Why: the frozen embedding and LM head of a 248,320 x 5,120 target are 2.5 GB each in bf16 (5 GB in fp32);
    read into each process (2 FSDP ranks, then evaluate) they were the largest resident tensors of a run. Mapped,
    every process on the node shares one copy in the page cache (counted as file-backed RSS), and nothing is
    read until a row is used."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    if name not in header:
        raise KeyError(f"{path}: no tensor {name!r}")
    info = header[name]
    if info["dtype"] not in SAFETENSORS_DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}; frozen target tensors must be one of "
                         f"{', '.join(SAFETENSORS_DTYPES)}")
    start, end = info["data_offsets"]
    raw = torch.from_file(str(path), shared=False, size=8 + n + end, dtype=torch.uint8)
    return raw[8 + n + start:8 + n + end].view(SAFETENSORS_DTYPES[info["dtype"]]).view(info["shape"])


def load_target_embeddings(target_cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed [V, H], lm_head [V, H]) from the target checkpoint, memory-mapped in the checkpoint's dtype
    (`mmap_tensor`); tied heads share the embedding."""
    from flashdraft.target import resolve_model_dir

    files = _weight_files(resolve_model_dir(target_cfg), target_cfg.revision)
    embed_name, head_name = _pick(list(files), "embed_tokens.weight"), _pick(list(files), "lm_head.weight")
    if embed_name is None:
        raise KeyError(f"target {target_cfg.model}: no '*embed_tokens.weight' tensor in its safetensors")

    embed = mmap_tensor(files[embed_name], embed_name)
    head = mmap_tensor(files[head_name], head_name) if head_name is not None else embed
    return embed, head


def target_layer_prefixes(names: list[str]) -> dict[int, str]:
    """Decoder layer index -> tensor-name prefix ("model.layers.7.") in the target checkpoint (text model only)."""
    import re

    out: dict[int, str] = {}
    for n in names:
        m = re.match(r"^(.*?\blayers\.(\d+)\.)", n)
        if m and "mtp" not in n and "vision" not in n and "visual" not in n:
            out.setdefault(int(m.group(2)), m.group(1))
    return out


def load_target_init(target_cfg, layer_ids: list[int]) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor | None]:
    """Per requested target decoder layer, its tensors by drafter-layer name (`self_attn.q_proj.weight`, ...), and
    the target's final norm weight: the `drafter.init=target` starting point."""
    from safetensors import safe_open

    from flashdraft.target import resolve_model_dir

    def wanted(name: str) -> bool:
        return ".layers." in name or name.endswith("norm.weight")

    files = _weight_files(resolve_model_dir(target_cfg), target_cfg.revision, wanted)
    prefixes = target_layer_prefixes(list(files))
    missing = [i for i in layer_ids if i not in prefixes]
    if missing:
        raise KeyError(f"target {target_cfg.model}: no decoder layer(s) {missing} (drafter.init_layers)")

    def read(name: str) -> torch.Tensor:
        with safe_open(str(files[name]), "pt") as f:
            return f.get_tensor(name)

    layers = [{n[len(prefixes[i]):]: read(n) for n in files if n.startswith(prefixes[i])} for i in layer_ids]
    norm_name = _pick([n for n in files if ".layers." not in n and n.endswith(".norm.weight")], "norm.weight")
    return layers, (read(norm_name) if norm_name else None)


# -- layers ---------------------------------------------------------------------------------------------------


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class DFlashAttention(nn.Module):
    def __init__(self, g: DrafterGeometry, window: int | None = None):
        super().__init__()
        self.nh, self.nkv, self.hd = g.num_heads, g.num_kv_heads, g.head_dim
        self.window = window  # sliding window of this layer (None: full attention)
        self.q_proj = nn.Linear(g.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(g.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(g.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, g.hidden_size, bias=False)
        self.q_norm = nn.RMSNorm(self.hd, eps=g.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.hd, eps=g.rms_norm_eps)

    def project_kv(self, h, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """h [1, L, H] -> (keys with RoPE, values), each [1, kv_heads, L, head_dim]."""
        L = h.shape[1]
        k = self.k_norm(self.k_proj(h).view(1, L, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(h).view(1, L, self.nkv, self.hd).transpose(1, 2)
        return _rope(k, *rope), v

    def forward(self, x, ctx, rope_q, rope_kv, layout: BlockLayout, impl: str, ctx_kv=None):
        """ctx_kv: the context's (keys, values) already projected (ContextCache); rope_kv then covers x only."""
        Q = x.shape[1]
        q = _rope(self.q_norm(self.q_proj(x).view(1, Q, self.nh, self.hd)).transpose(1, 2), *rope_q)
        if ctx_kv is None:
            k, v = self.project_kv(torch.cat([ctx, x], dim=1), rope_kv)
        else:
            k_x, v_x = self.project_kv(x, rope_kv)
            k, v = torch.cat([ctx_kv[0], k_x], dim=2), torch.cat([ctx_kv[1], v_x], dim=2)
        out = attend(q, k, v.to(q.dtype), layout, impl, self.window)
        return self.o_proj(out.transpose(1, 2).reshape(1, Q, self.nh * self.hd))


class DFlashMLP(nn.Module):
    def __init__(self, g: DrafterGeometry):
        super().__init__()
        self.gate_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.up_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.down_proj = nn.Linear(g.intermediate_size, g.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


ACTIVATION_CHECKPOINTING = ("none", "mlp", "layer")


class DFlashLayer(nn.Module):
    def __init__(self, g: DrafterGeometry, index: int = 0):
        super().__init__()
        self.self_attn = DFlashAttention(g, g.window(index))
        self.mlp = DFlashMLP(g)
        self.input_layernorm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.recompute = "none"  # training.activation_checkpointing (set by the trainer)
        if g.is_dflash2:  # DFlash2: block convolutions around both sublayers (dflash2.py)
            self.attention_conv = BlockConv(g.hidden_size, g.conv_kernel_size, g.conv_group_size)
            self.mlp_conv = BlockConv(g.hidden_size, g.conv_kernel_size, g.conv_group_size)
        else:
            self.attention_conv = self.mlp_conv = None

    def forward(self, x, ctx, rope_q, rope_kv, layout: BlockLayout, impl: str, ctx_kv=None):
        if self.recompute == "layer" and torch.is_grad_enabled():
            return checkpoint(self._forward, x, ctx, rope_q, rope_kv, layout, impl, ctx_kv, use_reentrant=False)
        return self._forward(x, ctx, rope_q, rope_kv, layout, impl, ctx_kv)

    def _forward(self, x, ctx, rope_q, rope_kv, layout: BlockLayout, impl: str, ctx_kv=None):
        """x [1, N*B, H]: whole blocks. DFlash2: the context keys/values come from `ctx` unconvolved (as vLLM's
        precomputed context KV); the convolutions act on the block rows only."""
        if self.attention_conv is None:
            x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_kv, layout, impl, ctx_kv)
            h = self.post_attention_layernorm(x)
            if self.recompute == "mlp" and torch.is_grad_enabled():
                return x + checkpoint(self.mlp, h, use_reentrant=False)
            return x + self.mlp(h)
        B = layout.block_size
        h, delta = self.attention_conv.prepare(self.input_layernorm(x), B)
        x = x + self.attention_conv.finish(self.self_attn(h, ctx, rope_q, rope_kv, layout, impl, ctx_kv), delta, B)
        h, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x), B)
        if self.recompute == "mlp" and torch.is_grad_enabled():
            return x + self.mlp_conv.finish(checkpoint(self.mlp, h, use_reentrant=False), delta, B)
        return x + self.mlp_conv.finish(self.mlp(h), delta, B)


@dataclass
class ContextCache:
    """Per draft layer, the keys (RoPE applied) and values [1, kv_heads, S, head_dim] of the fused target context
    of one sequence: what every draft cycle reads and only newly verified positions extend."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int


class DraftSession:
    """One sequence's drafting state: `extend` with the features of newly verified positions, `propose` the B-1
    drafts after the newest verified token. cached=False recomputes the whole context every cycle (the reference
    the cache is tested and benchmarked against)."""

    def __init__(self, drafter: DFlashDrafter, cached: bool = True):
        self.drafter, self.cached = drafter, cached
        self.cache: ContextCache | None = None
        self.features: torch.Tensor | None = None

    def extend(self, features: torch.Tensor) -> None:
        if self.cached:
            self.cache = self.drafter.extend_context(self.cache, features)
        else:
            self.features = features if self.features is None else torch.cat([self.features, features])

    def logits(self, last_token: int) -> torch.Tensor:
        return self.drafter.logits(self.hidden(last_token))

    def hidden(self, last_token: int) -> torch.Tensor:
        if self.cached:
            return self.drafter.cached_draft_hidden(self.cache, last_token)
        return self.drafter.draft_hidden(self.features, last_token)

    def propose(self, last_token: int) -> torch.Tensor:
        """DFlash: the argmax of each slot. DFlash2: the selector's greedy walk over the top-k candidates."""
        return self.drafter.propose_from_hidden(self.hidden(last_token), last_token)


class DFlashDrafter(nn.Module):
    def __init__(self, geometry: DrafterGeometry, embed: torch.Tensor | None = None,
                 lm_head: torch.Tensor | None = None, attn_impl: str = "auto"):
        super().__init__()
        g = self.geometry = geometry
        self.attn_impl = attn_impl
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
        starts at the mean target embedding or at zero (`drafter.mask_init`). Zero lowers the first loss (~15 vs
        ~65 nats on SmolLM2) but on the tiny random target made tests/integration/test_train.py::
        test_training_learns_the_rule learn too little (loss 9.56 vs 10.90 untrained), so the mean stays the
        default and the smollm2 presets choose zero."""
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

    def cached_draft_logits(self, cache: ContextCache, last_token: int, block_size: int | None = None
                            ) -> torch.Tensor:
        """`draft_logits` over a ContextCache."""
        return self.logits(self.cached_draft_hidden(cache, last_token, block_size))

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

    # -- persistence -----------------------------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        return asdict(self.geometry)

    def weights(self) -> dict[str, torch.Tensor]:
        """Trainable tensors by z-lab name, contiguous fp32 on CPU."""
        return {k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().contiguous()
                for k, v in self.state_dict().items()}

    def save_pretrained(self, folder: str | Path) -> Path:
        from safetensors.torch import save_file

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        save_file(self.weights(), str(out / WEIGHTS_FILE))
        (out / CONFIG_FILE).write_text(json.dumps(self.config_dict(), indent=2))
        return out

    @classmethod
    def from_pretrained(cls, source, *, target=None, device: str | torch.device = "cpu",
                        attn_impl: str = "auto", prefix: str = "") -> DFlashDrafter:
        """Load a drafter folder (local path or an ObjectStore + key prefix) or a z-lab export folder.

        The frozen embedding/LM head come from `target` (a TargetConfig; default: the one recorded in the
        drafter config)."""
        from safetensors.torch import load as load_bytes

        from flashdraft.store import ObjectStore

        if isinstance(source, ObjectStore):
            key = (prefix.rstrip("/") + "/") if prefix else ""
            config, weights = source.get_json(key + CONFIG_FILE), load_bytes(source.get(key + WEIGHTS_FILE))
        else:
            folder = Path(source)
            if (folder / CONFIG_FILE).is_file():
                config = json.loads((folder / CONFIG_FILE).read_text())
                weights = load_bytes((folder / WEIGHTS_FILE).read_bytes())
            elif (folder / "config.json").is_file():
                from flashdraft.zlab import read_zlab

                config, weights = read_zlab(folder)
            else:
                raise FileNotFoundError(f"{folder}: neither {CONFIG_FILE} nor a z-lab config.json")
        return cls.from_parts(config, weights, target=target, device=device, attn_impl=attn_impl)

    @classmethod
    def from_parts(cls, config: dict[str, Any], weights: dict[str, torch.Tensor], *, target=None,
                   device="cpu", attn_impl: str = "auto") -> DFlashDrafter:
        """The frozen embedding and LM head stay in the target checkpoint's dtype, memory-mapped on CPU
        (`mmap_tensor`); `logits` computes in the drafter's dtype all the same (`upcast_matmul`)."""
        from flashdraft.config import TargetConfig

        geometry = DrafterGeometry(**config)
        target_cfg = target if target is not None else TargetConfig(**geometry.target)
        embed, head = load_target_embeddings(target_cfg)
        model = cls(geometry, attn_impl=attn_impl)
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=True)
        model.set_frozen(embed, head)
        return model.to(device).eval()


def build_drafter(cfg, target_hf_config, init: str = "random", seed: int | None = None, tokenizer=None,
                  device: str | torch.device = "cpu", attn_impl: str = "auto",
                  frozen_dtype: torch.dtype | None = torch.float32) -> DFlashDrafter:
    """A drafter for `cfg` (RunConfig) on the target described by `target_hf_config`, with the target's frozen
    embedding/LM head loaded. init="random" gives the seeded untrained baseline (seed default training.seed).
    `frozen_dtype`: the embedding/LM head's dtype (None: the checkpoint's, memory-mapped, no copy)."""
    from flashdraft.target import load_tokenizer

    if init != "random":
        raise ValueError(f"init={init!r}: only 'random' (use DFlashDrafter.from_pretrained for a checkpoint)")
    text_cfg = text_config(target_hf_config)
    tok = tokenizer if tokenizer is not None else load_tokenizer(cfg.target)
    mask_id, trainable = resolve_mask_token(cfg.drafter.mask_token_id, tok, int(text_cfg.vocab_size))
    geometry = geometry_from_hf(
        target_hf_config, num_layers=cfg.drafter.num_layers, block_size=cfg.drafter.block_size,
        target_layer_ids=cfg.layer_ids(int(text_cfg.num_hidden_layers)), mask_token_id=mask_id,
        trainable_mask=trainable, target=cfg.target.model_dump(mode="json"), **cfg.drafter.geometry_overrides())
    geometry.draft_vocab_size = cfg.drafter.draft_vocab_size
    if cfg.drafter.kind == "dflash2":
        d = cfg.drafter
        geometry = replace(geometry, kind="dflash2", conv_kernel_size=d.conv_kernel_size,
                           conv_group_size=d.conv_group_size, selector_rank=d.selector_rank,
                           selector_top_k=d.selector_top_k)
    embed, head = load_target_embeddings(cfg.target)
    model = DFlashDrafter(geometry, attn_impl=attn_impl)
    if frozen_dtype is not None:
        embed, head = embed.to(frozen_dtype), head.to(frozen_dtype)  # no copy when the checkpoint has that dtype
    model.set_frozen(embed, head)
    model.init_weights(cfg.training.seed if seed is None else seed, cfg.drafter.mask_init)
    if cfg.drafter.init == "target":
        ids = cfg.drafter.resolved_init_layers(int(text_cfg.num_hidden_layers))
        copied = model.init_from_target(*load_target_init(cfg.target, ids))
        log.info("drafter init from target layers %s: %d tensors copied", ids, len(copied))
    return model.to(device)


def num_trainable_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

