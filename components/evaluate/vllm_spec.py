"""tau of an exported drafter measured by vLLM itself (offline `LLM` with DFlash speculation), and the greedy
outputs it serves, prompt by prompt. Imports only the standard library and vLLM, so it runs in any interpreter
with vLLM (the inference image, or `make vllm-venv` on CPU)::

    python -m flashdraft.components.evaluate.vllm_spec --target /models/Qwen3.6-27B \\
        --drafter /exports/zlab --prompts prompts.json --num-speculative-tokens 15 --max-new-tokens 256

`--method ngram` measures vLLM's prompt lookup instead (no drafter; `--prompt-lookup-min/-max`), `--method mtp` the
target's own MTP head.
`prompts.json`: a JSON list of token-id lists. `--num-speculative-tokens` is the drafter's block size - 1 (vLLM
ignores `block_size`); 0 runs the target alone (the reference). Prompts are decoded one at a time, so each one's
counters are its own. Stdout is JSON: per prompt the generated ids and vLLM's counters (vllm:spec_decode_num_drafts,
_num_accepted_tokens, _num_accepted_tokens_per_pos); over all prompts tau = 1 + accepted/drafts, per-position
acceptance (`flashdraft evaluate`'s definitions) and wall-clock tokens/s. vLLM's own logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def spec_counts(metrics) -> dict:
    """drafts, accepted tokens and accepted tokens per draft position from `LLM.get_metrics()` (cumulative)."""
    drafts = accepted = 0
    per_pos: list[int] = []
    for m in metrics:
        if m.name == "vllm:spec_decode_num_drafts":
            drafts += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            accepted += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = [a + int(b) for a, b in zip(per_pos or [0] * len(m.values), m.values, strict=True)]
    return {"drafts": drafts, "accepted": accepted, "accepted_per_position": per_pos}


def spec_metrics(counts: dict) -> dict:
    """tau and per-position acceptance (fraction of drafts whose k-th token was accepted) from `spec_counts`."""
    drafts = counts["drafts"]
    return {**counts, "tau": round(1 + counts["accepted"] / drafts, 4) if drafts else None,
            "acceptance_per_position": [round(c / drafts, 4) for c in counts["accepted_per_position"]]
            if drafts else []}


def _delta(after: dict, before: dict) -> dict:
    pos_before = before["accepted_per_position"] or [0] * len(after["accepted_per_position"])
    return {"drafts": after["drafts"] - before["drafts"], "accepted": after["accepted"] - before["accepted"],
            "accepted_per_position": [a - b for a, b in zip(after["accepted_per_position"], pos_before,
                                                            strict=True)]}


def speculative_config(method: str, drafter: str | None, num_speculative_tokens: int,
                       prompt_lookup: tuple[int, int] | None = None) -> dict | None:
    """vLLM's speculative_config: the DFlash drafter folder, or prompt lookup (`ngram`) with its (min, max)."""
    if not num_speculative_tokens:
        return None
    if method == "mtp":  # the target's own head: no drafter folder
        return {"method": "mtp", "num_speculative_tokens": num_speculative_tokens}
    if method == "ngram":
        lo, hi = prompt_lookup or (5, 5)
        return {"method": "ngram", "num_speculative_tokens": num_speculative_tokens, "prompt_lookup_min": lo,
                "prompt_lookup_max": hi}
    if not drafter:
        raise SystemExit("--drafter is required when --num-speculative-tokens > 0")
    return {"method": method, "model": drafter, "num_speculative_tokens": num_speculative_tokens}


def run(target: str, drafter: str | None, prompts: list[list[int]], num_speculative_tokens: int,
        max_new_tokens: int, dtype: str, max_model_len: int, tensor_parallel: int = 1, method: str = "dflash",
        prompt_lookup: tuple[int, int] | None = None) -> dict:
    on_cpu = not _cuda()
    if on_cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    spec = speculative_config(method, drafter, num_speculative_tokens, prompt_lookup)
    llm = LLM(model=target, tokenizer=target, dtype=dtype, tensor_parallel_size=tensor_parallel,
              max_model_len=max_model_len, disable_log_stats=False, speculative_config=spec, seed=0,
              enable_prefix_caching=False, enforce_eager=on_cpu)  # CPU: no graphs to capture
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, detokenize=False)
    rows, tokens, seconds = [], 0, 0.0
    before = spec_counts(llm.get_metrics())
    for ids in prompts:
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0]
        seconds += time.perf_counter() - start
        after = spec_counts(llm.get_metrics())
        rows.append({"ids": list(out.token_ids), "finish": out.finish_reason, **_delta(after, before)})
        tokens += len(out.token_ids)
        before = after
    return {"backend": "vllm", "speculative": spec is not None, "prompts": rows, "tokens": tokens,
            "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 2) if seconds else None,
            **spec_metrics(before)}


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def missing_mask_override(drafter: str) -> str | None:
    """Why a z-lab folder would draft wrong in vLLM, or None: a trained mask embedding (config.json's
    `flashdraft.trainable_mask`) reaches vLLM only through mask_embedding.pt, which export writes only with
    export.mask_embedding_pt=true (a pickle); without it vLLM drafts mask slots with the placeholder row."""
    with open(os.path.join(drafter, "config.json")) as f:
        trained = (json.load(f).get("flashdraft") or {}).get("trainable_mask")
    if trained and not os.path.exists(os.path.join(drafter, "mask_embedding.pt")):
        return (f"--drafter {drafter}: the drafter's mask embedding is trained but the folder has no "
                "mask_embedding.pt, the only file vLLM reads it from: re-export with export.mask_embedding_pt=true")
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", help="z-lab format folder (flashdraft export)")
    ap.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    ap.add_argument("--num-speculative-tokens", type=int, required=True, help="block size - 1; 0: target alone")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--tensor-parallel", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--method", default="dflash", choices=["dflash", "ngram", "mtp"],
                    help="dflash: the --drafter folder; ngram: vLLM's prompt lookup; mtp: the target's MTP head")
    ap.add_argument("--prompt-lookup-min", type=int, default=5, help="ngram: vLLM's prompt_lookup_min")
    ap.add_argument("--prompt-lookup-max", type=int, default=5, help="ngram: vLLM's prompt_lookup_max")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    if args.drafter and args.num_speculative_tokens and (problem := missing_mask_override(args.drafter)):
        ap.error(problem)
    # vLLM and its engine processes log to stdout (even at shutdown): keep stdout for the result alone.
    result_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    with open(args.prompts) as f:
        prompts = json.load(f)
    result = run(args.target, args.drafter, prompts, args.num_speculative_tokens, args.max_new_tokens, args.dtype,
                 args.max_model_len, args.tensor_parallel, args.method,
                 (args.prompt_lookup_min, args.prompt_lookup_max))
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    result_out.write(text + "\n")
    result_out.flush()


if __name__ == "__main__":
    main()
