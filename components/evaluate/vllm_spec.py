"""Optional GPU path: tau of an exported drafter measured by vLLM itself (offline `LLM` with DFlash speculation).

Run in the inference image (or a vLLM venv), not in CI: DFlash needs a vLLM with the `dflash` method (>= 0.20)
and an attention backend with non-causal support (FLASH_ATTN or FLEX; see dflash.md section 6)::

    python -m flashdraft.components.evaluate.vllm_spec --target /models/Qwen3.6-27B \\
        --drafter /exports/zlab --prompts prompts.json --num-speculative-tokens 15 --max-new-tokens 256

`prompts.json` is a JSON list of token-id lists (e.g. from `load_eval_prompts`). The result, printed as JSON, has
tau = 1 + accepted/drafts and the per-position acceptance from vLLM's own counters (vllm:spec_decode_*), the
same definitions `flashdraft evaluate` uses, plus the wall-clock tokens/s of the speculative run. Only the
standard library and vLLM are imported, so any interpreter with vLLM runs it.
"""

from __future__ import annotations

import argparse
import json
import time


def spec_metrics(metrics) -> dict:
    """tau and per-position acceptance from `LLM.get_metrics()` (needs disable_log_stats=False)."""
    drafts = accepted = 0
    per_pos: list[float] = []
    for m in metrics:
        if m.name == "vllm:spec_decode_num_drafts":
            drafts += m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            accepted += m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = [a + b for a, b in zip(per_pos or [0] * len(m.values), m.values, strict=True)]
    return {"drafts": drafts, "accepted": accepted, "tau": round(1 + accepted / drafts, 4) if drafts else None,
            "acceptance_per_position": [round(c / drafts, 4) for c in per_pos] if drafts else []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True, help="z-lab format folder (flashdraft export)")
    ap.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    ap.add_argument("--num-speculative-tokens", type=int, required=True, help="block size - 1")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--tensor-parallel", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()

    from vllm import LLM, SamplingParams

    with open(args.prompts) as f:
        prompts = [{"prompt_token_ids": ids} for ids in json.load(f)]
    llm = LLM(model=args.target, dtype=args.dtype, tensor_parallel_size=args.tensor_parallel,
              max_model_len=args.max_model_len, disable_log_stats=False,
              speculative_config={"method": "dflash", "model": args.drafter,
                                  "num_speculative_tokens": args.num_speculative_tokens})
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    result = {"backend": "vllm", "prompts": len(prompts), "tokens": tokens, "seconds": round(seconds, 3),
              "tokens_per_s": round(tokens / seconds, 2), **spec_metrics(llm.get_metrics())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
