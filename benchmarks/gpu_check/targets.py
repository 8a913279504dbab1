"""The checks' targets and inputs: seeded random Qwen3 models saved as HF folders (a word-level tokenizer over the
vocabulary, so every stage loads them like any HF folder), run configs pointed at them, random rows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from flashdraft.components.extract.source import Row
from flashdraft.config import load_config


@dataclass
class TargetSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    def hf_config(self) -> Qwen3Config:
        return Qwen3Config(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, head_dim=self.head_dim, rope_theta=1_000_000.0,
                           max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
                           eos_token_id=2, pad_token_id=0)


TINY = TargetSpec("tiny", 8, 256, 4, 2, 64, 768, 49152)              # the tiny preset's shape (flashdraft.target.model)
WIDE = TargetSpec("qwen3-4096", 8, 4096, 32, 8, 128, 12288, 151936)  # Qwen3-8B's layer shape and vocabulary


def save_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer over `vocab_size` tokens t0..tN (pad t0, bos t1, eos t2, unk t3)."""
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")),
                                  pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3")
    tok.save_pretrained(folder)


def build_target(spec: TargetSpec, folder: Path, seed: int = 0, device: str = "cpu", dtype: str = "float32") -> Path:
    """A seeded random Qwen3 saved as an HF folder (weights in `dtype`; `device` only speeds up the random init)."""
    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(spec.hf_config()).to(getattr(torch, dtype))
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(folder, spec.vocab)
    return folder


def run_config(folder: Path, spec: TargetSpec, work: Path, *, drafter_layers: int = 1, block_size: int = 8,
               max_anchors: int = 64, tokens_per_step: int = 2048, lr: float = 1e-3,
               sliding_window: int | None = None, layer_types: list[str] | None = None):
    return load_config(preset="tiny", overrides={
        "target.source": "hf", "target.model": str(folder), "target.dtype": "float32",
        "target.num_layers": spec.layers, "target.hidden_size": spec.hidden,
        "storage.root": f"file://{work}/runs", "features.batch_tokens": 8192,
        "drafter.num_layers": drafter_layers, "drafter.block_size": block_size,
        "drafter.max_anchors": max_anchors, "drafter.mask_token_id": spec.vocab - 1,
        "training.tokens_per_step": tokens_per_step, "training.lr": lr, "training.grad_clip": 1.0,
        "drafter.sliding_window": sliding_window, "drafter.layer_types": layer_types})


def random_rows(n: int, lengths: tuple[int, int], vocab: int, seed: int) -> list[Row]:
    """Rows of random tokens (prompt + response halves); only the response half carries the loss."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        T = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=g))
        ids = torch.randint(4, vocab - 1, (T,), generator=g).tolist()
        rows.append(Row(f"s{i}", ids, [0] * (T // 2) + [1] * (T - T // 2)))
    return rows


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
