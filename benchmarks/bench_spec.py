"""Speculative decoding on CPU, side by side in one run: the target alone vs DFlash with the drafter's context
keys/values cached vs recomputed every cycle, on the same prompts, interleaved prompt by prompt.

The drafter is overfit on the prompts' own greedy replies (features captured from the target, the trainer's
packing and loss, a few hundred small steps), so it drafts well and the table shows what the decode loop itself
costs at high acceptance (the mechanics the issue's speedup goal depends on), not how well a recipe generalises.
All three decoders run the same target forwards and must agree token for token (greedy). Timings on a shared
machine are noisy: the host's load average is printed beside them, and only the ratios of one run mean much.
With --vllm (needs `make vllm-venv`), the drafter is exported (z-lab format, fp32) and vLLM decodes the same
prompts with and without DFlash; its tau and outputs are compared with flashdraft's.

    python benchmarks/bench_spec.py [--preset smollm2-local] [--prompts 4] [--steps 150] [--anchors 8]
        [--max-new-tokens 64] [--vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from flashdraft.components.evaluate.evaluate import _eos_ids, summarize
from flashdraft.components.evaluate.prompts import encode_chat
from flashdraft.components.evaluate.spec import speculative_generate, target_generate
from flashdraft.components.evaluate.summary import DecodeStats
from flashdraft.components.generate.backends import VLLM_PYTHON_ENV
from flashdraft.components.prep.demo import demo_rows
from flashdraft.config import load_config
from flashdraft.drafter.batch import pack
from flashdraft.drafter.loss import dflash_loss
from flashdraft.drafter.persistence import build_drafter
from flashdraft.features.shard import Sample
from flashdraft.target.capture import capture_layers
from flashdraft.target.model import load_causal_lm, load_hf_config, load_tokenizer, resolve_model_dir, set_cpu_threads

ROOT = Path(__file__).resolve().parents[1]


def overfit(cfg, model, samples: list[Sample], steps: int, lr: float):
    """A drafter trained on `samples` with the trainer's packing and loss."""
    drafter = build_drafter(cfg, load_hf_config(cfg.target), seed=cfg.training.seed)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    d = cfg.drafter
    t0 = time.time()
    for step in range(steps):
        batch = pack(samples, d.block_size, d.max_anchors, seed=cfg.training.seed, epoch=step)
        out = dflash_loss(drafter(*batch.drafter_inputs()), drafter.lm_head_weight, batch.labels, batch.valid,
                          d.resolved_gamma, d.loss_normalization)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        if step % 25 == 0 or step == steps - 1:
            acc = (out.correct.sum() / out.count.sum().clamp_min(1)).item()
            print(f"  step {step:4d}  loss {out.loss.item():.3f}  acc {acc:.3f}  ({time.time() - t0:.0f} s)",
                  flush=True)
    return drafter.eval()


def vllm_half(args, cfg, drafter, prompts: list[list[int]], ours: DecodeStats) -> None:
    from flashdraft.components.export.export import _files_zlab

    python = os.environ.get(VLLM_PYTHON_ENV) or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        print(f"vLLM: skipped (no interpreter at {python}; make vllm-venv)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "zlab"
        export.mkdir()
        for name, data in _files_zlab(drafter, "float32").items():
            (export / name).write_bytes(data)
        (Path(tmp) / "prompts.json").write_text(json.dumps(prompts))
        runs = {}
        for label, k in (("plain", 0), ("dflash", cfg.drafter.block_size - 1)):
            cmd = [python, "-m", "flashdraft.components.evaluate.vllm_spec", "--target",
                   str(resolve_model_dir(cfg.target)), "--drafter", str(export), "--prompts",
                   str(Path(tmp) / "prompts.json"), "--num-speculative-tokens", str(k), "--max-new-tokens",
                   str(args.max_new_tokens), "--dtype", "float32", "--max-model-len", "2048"]
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
            runs[label] = json.loads(done.stdout.strip().splitlines()[-1])
    plain, spec = runs["plain"], runs["dflash"]
    same = [a["ids"] == b["ids"] for a, b in zip(plain["prompts"], spec["prompts"], strict=True)]
    print(f"vLLM plain {plain['tokens_per_s']} tok/s, DFlash {spec['tokens_per_s']} tok/s; outputs equal "
          f"{sum(same)}/{len(same)}; tau vLLM {spec['tau']} ({spec['drafts']} drafts, {spec['accepted']} accepted) "
          f"vs flashdraft {ours.tau} ({ours.cycles} cycles, {ours.accepted} accepted)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smollm2-local")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--anchors", type=int, default=8, help="blocks per prompt per step (the LM head dominates)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--vllm", action="store_true", help="also serve the drafter with vLLM (make vllm-venv)")
    args = ap.parse_args()
    cfg = load_config(preset=args.preset, overrides={"drafter.max_anchors": args.anchors})
    set_cpu_threads(cfg)
    tok, model = load_tokenizer(cfg.target), load_causal_lm(cfg.target)
    layer_ids = cfg.layer_ids()
    eos = _eos_ids(tok, model)
    prompts = [encode_chat(tok, [next(m for m in r["messages"] if m["role"] == "user")], f"demo row {i}")
               for i, r in enumerate(demo_rows()[: args.prompts])]
    samples = []
    for i, p in enumerate(prompts):
        reply = target_generate(model, p, args.max_new_tokens, eos).tokens
        ids = torch.tensor(p + reply)
        with capture_layers(model, layer_ids) as cap, torch.inference_mode():
            model(input_ids=ids[None], logits_to_keep=1)
            feats = cap.features()[0].clone()
        samples.append(Sample(f"demo-{i}", ids, (torch.arange(len(ids)) >= len(p)).to(torch.uint8), feats))
    print(f"overfitting a drafter on {len(samples)} prompts x {args.max_new_tokens} reply tokens, {args.steps} steps")
    drafter = overfit(cfg, model, samples, args.steps, args.lr)

    class Recompute:  # the drafter without its context cache: the whole context re-fused and re-projected per cycle
        def new_session(self):
            return drafter.new_session(cached=False)

    decoders = {"target": None, "dflash (cached ctx)": drafter, "dflash (recomputed ctx)": Recompute()}
    for p in prompts[:1]:  # warm-up, untimed
        target_generate(model, p, 8, eos)
        speculative_generate(model, drafter, p, layer_ids, 16, eos)
    runs = {name: [] for name in decoders}
    load_before = os.getloadavg()[0]
    for p in prompts:
        for name, d in decoders.items():
            runs[name].append(target_generate(model, p, args.max_new_tokens, eos) if d is None else
                              speculative_generate(model, d, p, layer_ids, args.max_new_tokens, eos))
    load_after = os.getloadavg()[0]
    ref = [g.tokens for g in runs["target"]]
    base = summarize(runs["target"]).tokens_per_s
    print(f"\n{args.preset}: {len(prompts)} prompts x {args.max_new_tokens} new tokens, {torch.get_num_threads()} "
          f"threads, host load (1 min) {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} CPUs")
    print(f"{'decoder':26s} {'tok/s':>8s} {'speedup':>8s} {'tau':>6s} {'lossless':>9s}")
    for name in decoders:
        s = summarize(runs[name])
        lossless = all(g.tokens == r for g, r in zip(runs[name], ref, strict=True))
        print(f"{name:26s} {s.tokens_per_s:8.2f} {s.tokens_per_s / base:8.2f} {s.tau or 1.0:6.2f} "
              f"{str(lossless):>9s}")
    if args.vllm:
        vllm_half(args, cfg, drafter, prompts, summarize(runs["dflash (cached ctx)"]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
