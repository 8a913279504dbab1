"""vLLM engine in its own process: `python -m flashdraft.components.generate.vllm_worker`.

vLLM's `LLM(...)` must be created under a `__main__` guard (it spawns engine processes), and on CPU machines it
lives in its own venv (`make vllm-venv`), so generation talks to it over a tiny JSON-lines protocol on
stdin/stdout (flashdraft.target.vllm_protocol). Only the standard library and vLLM are imported, so it runs in an
interpreter that has neither pyarrow nor the rest of flashdraft's dependencies.

Protocol: the first line is the engine config; the worker answers `{"ready": true, "startup_s": ...}`. Each
further line is `{"prompts": [[ids]], "seeds": [...], "sampling": {...}}`, answered by
`{"outputs": [{"ids": [...], "finish": "stop" | "length"}], "seconds": ...}`. EOF ends the worker. Everything
vLLM prints goes to stderr so stdout carries only protocol lines.
"""

from __future__ import annotations

import os

from flashdraft.target.vllm_protocol import serve


def _engine(init: dict):
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    # init["target"]: model, tokenizer, revision + tokenizer_revision (the run's pinned commit), load_format
    # (safetensors) and trust_remote_code, from flashdraft.target.model.vllm_target_args
    return LLM(**init["target"], dtype=init["dtype"], seed=init["seed"],
               tensor_parallel_size=init["tensor_parallel"], max_model_len=init["max_model_len"],
               enable_prefix_caching=init["enable_prefix_caching"],
               enforce_eager=not on_gpu)  # CPU: no graphs to capture, and torch.compile only costs start-up


def _generate(llm, request: dict) -> list[dict]:
    from vllm import SamplingParams

    s = request["sampling"]
    params = [SamplingParams(temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"],
                             max_tokens=s["max_tokens"], seed=seed, stop_token_ids=s["stop_token_ids"],
                             ignore_eos=False, detokenize=False)
              for seed in request["seeds"]]
    prompts = [{"prompt_token_ids": ids} for ids in request["prompts"]]
    outputs = llm.generate(prompts, sampling_params=params, use_tqdm=False)
    return [{"ids": list(o.outputs[0].token_ids), "finish": o.outputs[0].finish_reason} for o in outputs]


def main() -> None:
    serve(_engine, lambda llm, request: {"outputs": _generate(llm, request)})


if __name__ == "__main__":
    main()
