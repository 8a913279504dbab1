"""Generation throughput, hf vs vLLM (CPU here, GPU in a pod), on the same prompts in one run.

Both backends answer the same prep output through `run_generate`, so the numbers include exactly what the stage
does (templating, batching, committing); model/engine start-up is reported separately. Greedy outputs are also
compared token for token. The vLLM half runs through the worker in $FLASHDRAFT_VLLM_PYTHON (default
.venv-vllm/bin/python, `make vllm-venv`); without it the table says it was skipped and why.

    python benchmarks/bench_generate.py [--preset smollm2-local] [--prompts 32] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from flashdraft.components.generate.backends import VLLM_PYTHON_ENV
from flashdraft.components.generate.generate import run_generate
from flashdraft.components.prep.prep import run_prep
from flashdraft.config import load_config
from flashdraft.run.records import iter_responses
from flashdraft.storage.store import open_store

ROOT = Path(__file__).resolve().parents[1]


def _run(args, backend: str, root: str):
    cfg = load_config(preset=args.preset, overrides={
        "storage.root": f"file://{root}/{backend}", "generation.backend": backend,
        "data.max_samples": args.prompts, "data.eval_count": 0, "data.num_shards": 1,
        "data.max_response_tokens": args.max_new_tokens, "generation.chunk_size": args.prompts,
        "generation.batch_size": args.batch_size})
    run_prep(cfg)
    t0 = time.time()
    done = {**run_generate(cfg, 0).dump(), "wall_s": time.time() - t0}
    return done, [r["input_ids"] for r in iter_responses(open_store(cfg.storage, cfg.run_id), 0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-local")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    vllm_python = os.environ.get(VLLM_PYTHON_ENV) or str(ROOT / ".venv-vllm" / "bin" / "python")
    results, skipped = {}, None
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        results["hf"] = _run(args, "hf", tmp)
        if Path(vllm_python).exists():
            os.environ[VLLM_PYTHON_ENV] = vllm_python
            results["vllm"] = _run(args, "vllm", tmp)
        else:
            skipped = f"vllm skipped: no interpreter at {vllm_python} (run `make vllm-venv`)"

    base = results["hf"][0]["tokens_per_s"]
    print(f"\ngeneration: preset {args.preset}, {args.prompts} prompts, <= {args.max_new_tokens} new tokens each, "
          f"{os.cpu_count()} CPUs")
    print(f"{'backend':8} {'samples':>7} {'tokens':>7} {'gen s':>8} {'tokens/s':>9} {'startup s':>9} "
          f"{'wall s':>7} {'x hf':>6}")
    for name, (done, _) in results.items():
        print(f"{name:8} {done['samples']:7d} {done['generated_tokens']:7d} {done['generation_seconds']:8.2f} "
              f"{done['tokens_per_s']:9.1f} {done['backend_startup_s']:9.1f} {done['wall_s']:7.1f} "
              f"{done['tokens_per_s'] / base:6.2f}")
    if "vllm" in results:
        same = sum(a == b for a, b in zip(results["hf"][1], results["vllm"][1], strict=True))
        print(f"greedy outputs identical: {same}/{len(results['hf'][1])}")
    if skipped:
        print(skipped)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
