"""Generation throughput of the `hf` backend: static `generate` batches (the path before continuous batching) vs
continuous batching, on the same prompts and the same loaded model in one run; optionally vLLM beside them.

Both hf paths answer the preset's prep output (builtin:demo for smollm2-local) in the stage's chunks
(`generation.chunk_size` prompts per call): the static path with the settings it ran under before (batches and
chunks of 64), the continuous path with the preset's. Greedy replies are compared token for token. The vLLM row
runs the whole stage through the worker in $FLASHDRAFT_VLLM_PYTHON (default .venv-vllm/bin/python, `make
vllm-venv`); without it the table says it was skipped and why.

    python benchmarks/bench_generate.py [--preset smollm2-local] [--prompts 128] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from flashdraft.components.generate.backends import VLLM_PYTHON_ENV, HFBackend, generate_static
from flashdraft.components.generate.generate import _load_prompts, run_generate
from flashdraft.components.prep.prep import run_prep
from flashdraft.config import load_config
from flashdraft.perf.cpu_gemm import measure_gemm_flops
from flashdraft.storage.store import open_store
from flashdraft.target.chat import build_turn
from flashdraft.target.model import load_tokenizer, set_cpu_threads

ROOT = Path(__file__).resolve().parents[1]
STATIC = {"batch_size": 64, "chunk_size": 64}  # smollm2-local's generation settings before continuous batching


def _prompts(cfg, tok) -> list[list[int]]:
    """The first turn of every prep prompt, templated as the stage does."""
    run_prep(cfg)
    rows = _load_prompts(open_store(cfg.storage, cfg.run_id), 0)
    out = []
    for r in rows:
        turn = list(r["regenerate_turns"])[0]
        out.append(build_turn(tok, json.loads(r["messages"]), turn, {}, cfg.data.chat_template_kwargs)[0])
    return out


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(generate, prompts: list[list[int]], chunk: int) -> tuple[float, float, list[list[int]]]:
    """Wall seconds, CPU seconds (all threads: the work done, what a busy machine's wall time hides) and reply ids
    of answering `prompts` in calls of `chunk` prompts."""
    t0, c0, ids = time.perf_counter(), _cpu_seconds(), []
    for start in range(0, len(prompts), chunk):
        part = prompts[start:start + chunk]
        ids += [r.ids for r in generate(part, list(range(start, start + len(part))))]
    return time.perf_counter() - t0, _cpu_seconds() - c0, ids


def _vllm(args, root: str) -> tuple[float, float]:
    cfg = load_config(preset=args.preset, overrides={
        "storage.root": f"file://{root}/vllm", "generation.backend": "vllm", "data.max_samples": args.prompts,
        "data.eval_count": 0, "data.num_shards": 1, "data.max_response_tokens": args.max_new_tokens})
    run_prep(cfg)
    done = run_generate(cfg, 0)
    return done.generation_seconds, done.generated_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-local")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        cfg = load_config(preset=args.preset, overrides={
            "storage.root": f"file://{tmp}/hf", "generation.backend": "hf", "data.max_samples": args.prompts,
            "data.eval_count": 0, "data.num_shards": 1, "data.max_response_tokens": args.max_new_tokens})
        set_cpu_threads(cfg)
        tok = load_tokenizer(cfg.target)
        prompts = _prompts(cfg, tok)
        backend = HFBackend(cfg, tok)
        g = cfg.generation
        static_cfg = g.model_copy(update=STATIC)
        rows = {"static": _timed(lambda p, s: generate_static(backend.model, p, s, static_cfg, args.max_new_tokens,
                                                              backend.stop_ids, backend.pad_id),
                                 prompts, STATIC["chunk_size"]),
                "continuous": _timed(backend.generate, prompts, g.chunk_size)}
        gemm = measure_gemm_flops()
        vllm_python = os.environ.get(VLLM_PYTHON_ENV) or str(ROOT / ".venv-vllm" / "bin" / "python")
        vllm = None
        if Path(vllm_python).exists():
            os.environ[VLLM_PYTHON_ENV] = vllm_python
            vllm = _vllm(args, tmp)

    print(f"\ngeneration: preset {args.preset}, {len(prompts)} prompts, <= {args.max_new_tokens} new tokens each, "
          f"{os.cpu_count()} CPUs, measured GEMM rate {gemm / 1e9:.0f} GFLOP/s")
    print(f"{'path':12} {'rows':>5} {'chunk':>5} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'x static':>8} "
          f"{'cpu s':>7} {'tokens/cpu s':>12} {'x static':>8} {'gemm share':>10}")
    static_tokens = sum(map(len, rows["static"][2]))
    base, base_cpu = static_tokens / rows["static"][0], static_tokens / rows["static"][1]
    settings = {"static": STATIC, "continuous": {"batch_size": g.batch_size, "chunk_size": g.chunk_size}}
    for name, (seconds, cpu, ids) in rows.items():
        tokens = sum(map(len, ids))
        flops = sum(backend.cost.reply(len(p), len(r)) for p, r in zip(prompts, ids, strict=True)) \
            if backend.cost else None
        print(f"{name:12} {settings[name]['batch_size']:5d} {settings[name]['chunk_size']:5d} {tokens:7d} "
              f"{seconds:8.1f} {tokens / seconds:9.1f} {tokens / seconds / base:8.2f} {cpu:7.1f} "
              f"{tokens / cpu:12.1f} {tokens / cpu / base_cpu:8.2f} "
              f"{f'{flops / seconds / gemm:.0%}' if flops else '-':>10}")
    if vllm:
        print(f"{'vllm':12} {'':5} {'':5} {vllm[1]:7d} {vllm[0]:8.1f} {vllm[1] / vllm[0]:9.1f} "
              f"{vllm[1] / vllm[0] / base:8.2f}")
    else:
        print(f"vllm skipped: no interpreter at {vllm_python} (run `make vllm-venv`)")
    if g.temperature == 0:
        same = sum(a == b for a, b in zip(rows["static"][2], rows["continuous"][2], strict=True))
        print(f"greedy replies identical (static vs continuous): {same}/{len(prompts)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
