"""Run inside the vLLM venv (tests/vllm/test_dflash2_vllm.py starts it): vLLM's own DFlash2 model class loads a
flashdraft export and drafts one block; the result goes to a safetensors file for the test to compare.

What is vLLM's code here: config parsing (EngineArgs -> SpeculativeConfig, the draft's DFlash2DraftModel
architecture and dflash_config keys), `DFlash2Qwen3ForCausalLM` construction and `load_weights` (names, shapes,
mask_embedding.pt), every layer's forward (norms, qkv/o projections, q/k norms, RoPE, MLP, `attention_conv` /
`mlp_conv` on vLLM's CPU path), `compute_candidates` (its top-k over the LM head) and the `CandidateSelector`.
What is not: vLLM's attention core reads the context keys/values from its paged KV cache inside its engine, so
here `AttentionCoreSdpa` (a stand-in for the `Attention` layer only) attends over the context keys/values
computed with vLLM's own modules (fc, hidden_norm, each layer's qkv_proj + k_norm + rotary) plus the block's.
vLLM's DFlash attention itself is covered end to end by tests/vllm/test_spec_vllm.py. Full-attention drafters
only (no window here).

    python dflash2_vllm_worker.py TARGET_DIR EXPORT_DIR INPUTS.safetensors OUT.safetensors

INPUTS holds `features` [S, n*H] (the context's target features) and `anchor` [1] (the last verified token);
OUT holds `hidden` [B, H] (final-normed block states), `candidate_ids` / `unary` [B-1, k] (compute_candidates)
and `scores` [B-1, k, k] (the selector). stdout's last line is a JSON object with what config parsing said.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class AttentionCoreSdpa(torch.nn.Module):
    """Stand-in for one layer's `Attention` module: block queries attend to the context's keys/values (given)
    and the block's own, bidirectionally (DFlash blocks are non-causal), with vLLM's GQA layout and scaling."""

    def __init__(self, context_k, context_v, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.k, self.v = context_k, context_v
        self.nh, self.nkv, self.hd, self.scale = num_heads, num_kv_heads, head_dim, scale

    def forward(self, q, k, v):
        T = q.shape[0]
        keys = torch.cat([self.k, k]).view(-1, self.nkv, self.hd).transpose(0, 1)
        values = torch.cat([self.v, v]).view(-1, self.nkv, self.hd).transpose(0, 1)
        rep = self.nh // self.nkv
        keys, values = keys.repeat_interleave(rep, 0), values.repeat_interleave(rep, 0)
        queries = q.view(T, self.nh, self.hd).transpose(0, 1)
        out = torch.nn.functional.scaled_dot_product_attention(queries, keys, values, scale=self.scale)
        return out.transpose(0, 1).reshape(T, self.nh * self.hd)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    target, export, inputs_path, out_path = sys.argv[1:5]
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs

    draft_cfg = json.load(open(os.path.join(export, "config.json")))
    block = int(draft_cfg["dflash_config"]["block_size"])
    spec = {"method": "dflash", "model": export, "num_speculative_tokens": block - 1}
    common = dict(model=target, tokenizer=target, dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    report = {}
    try:  # the whole engine config: on CPU it must get past the draft config and stop at the runner check
        EngineArgs(**common, speculative_config=spec).create_engine_config()
        report["engine_config"] = "accepted"
    except Exception as e:  # noqa: BLE001 - the message is the result
        report["engine_config"] = f"{type(e).__name__}: {e}"
    args = EngineArgs(**common, speculative_config=spec)
    vllm_config = EngineArgs(**common).create_engine_config()
    vllm_config.speculative_config = args.create_speculative_config(vllm_config.model_config,
                                                                    vllm_config.parallel_config)
    draft = vllm_config.speculative_config.draft_model_config
    report.update(architectures=list(draft.architectures), method=vllm_config.speculative_config.method,
                  num_speculative_tokens=vllm_config.speculative_config.num_speculative_tokens)

    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}", backend="gloo")
        initialize_model_parallel(1, 1)
        from vllm.model_executor.models.qwen3_dflash2 import DFlash2Qwen3ForCausalLM

        model = DFlash2Qwen3ForCausalLM(vllm_config=vllm_config).eval()
        model.load_weights(load_file(os.path.join(export, "model.safetensors")).items())
        # vLLM shares the target's embedding and LM head with the drafter; the test target's are the same file
        with safe_open(os.path.join(target, "model.safetensors"), "pt") as f:
            names = list(f.keys())
            embed = f.get_tensor(next(n for n in names if n.endswith("embed_tokens.weight")))
            head_name = next((n for n in names if n.endswith("lm_head.weight")), None)
            head = f.get_tensor(head_name) if head_name else embed
        model.model.embed_tokens.weight.data.copy_(embed)
        model.lm_head.weight.data.copy_(head)
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        process_weights_after_loading(model, vllm_config.model_config, torch.device("cpu"))  # the loader's last step
        report["separate_mask_embedding"] = bool(model.model.has_separate_mask_embedding)

        inputs = load_file(inputs_path)
        features, anchor = inputs["features"].float(), int(inputs["anchor"][0])
        S = features.shape[0]
        with torch.no_grad():
            context = model.model.hidden_norm(model.combine_hidden_states(features))
            ctx_pos = torch.arange(S)
            for layer in model.model.layers:
                attn = layer.self_attn
                qkv, _ = attn.qkv_proj(context)
                q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
                k = attn.k_norm(k.view(S, -1, attn.head_dim)).view(S, -1)
                _, k = attn.rotary_emb(ctx_pos, q.clone(), k)
                attn.attn = AttentionCoreSdpa(k, v, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scaling)
            mask_id = int(draft_cfg["dflash_config"]["mask_token_id"])
            input_ids = torch.tensor([anchor] + [mask_id] * (block - 1))
            hidden = model(input_ids, torch.arange(S, S + block))
            ids, unary = model.compute_candidates(hidden[1:])
            scores = model.model.candidate_selector(ids[None], unary[None], hidden[None, 1:],
                                                    torch.tensor([anchor]))[0]
        save_file({"hidden": hidden.contiguous(), "candidate_ids": ids.contiguous(), "unary": unary.contiguous(),
                   "scores": scores.contiguous()}, out_path)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
