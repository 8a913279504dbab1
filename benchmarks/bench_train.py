"""Training-step benchmark on the CPU reference geometry, side by side with speculators 0.9.0's DFlash.

Geometry: SmolLM2-135M-Instruct target (30 layers, hidden 576, vocab 49152), 1 drafter layer, one sequence of 512
tokens (a chat prompt + the target's own greedy response, features captured from the real target), 64 anchors,
block 16, 2 threads; median of >= 10 timed steps after warm-up. A step = forward + loss + backward + AdamW.

Equal loss definition: hard-label CE over slots 1..15 with w_k = exp(-(k-1)/gamma), normalised by the number of
valid slots (our `loss_normalization=mask`, speculators' `ce` loss). Speculators takes its labels from the
verifier's argmax at anchor+k-1, we take the data token at anchor+k: the response is the target's greedy output,
so they are the same tokens. Speculators runs in its own venv (`make bench-venv`: .venv-bench with
torch==2.13.0 and `--no-deps speculators==0.9.0 hs-connectors==0.9.0`), as `draft_attn_impl="sdpa"` with the
eager loss, on the identical batch (handed over as a safetensors file); its layer ids are ours + 1.

    .venv/bin/python benchmarks/bench_train.py [--steps 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SEQ, ANCHORS, BLOCK, THREADS, GAMMA = 512, 64, 16, 2, 7.0
PROMPT = ("Write a long, detailed essay on the history of computing, from mechanical calculators and Babbage's "
          "engines through vacuum tubes, transistors, integrated circuits, personal computers, the internet and "
          "smartphones. Cover the key people, machines and ideas in each era.")
ROOT = Path(__file__).resolve().parent.parent
BENCH_PY = ROOT / ".venv-bench" / "bin" / "python"


class PeakRSS:
    """Peak resident memory above the level at start, sampled every 2 ms (CPU tensors are not tracked otherwise)."""

    def __init__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    @property
    def peak_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def make_batch(path: Path) -> None:
    """Prompt + greedy response from the real SmolLM2 target, padded/cut to SEQ, with its layer features."""
    import torch
    from safetensors.torch import save_file

    from flashdraft.capture import capture_layers
    from flashdraft.config import load_config
    from flashdraft.target import load_causal_lm, load_tokenizer

    cfg = load_config(preset="smollm2-local")
    tok = load_tokenizer(cfg.target)
    model = load_causal_lm(cfg.target)
    prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=SEQ - prompt.shape[1], min_new_tokens=SEQ - prompt.shape[1],
                             do_sample=False)
    ids = out[0, :SEQ]
    loss_mask = torch.zeros(SEQ, dtype=torch.uint8)
    loss_mask[prompt.shape[1]:] = 1
    layer_ids = cfg.layer_ids(30)
    with torch.no_grad(), capture_layers(model, layer_ids + [29]) as cap:
        model.model(input_ids=ids[None])
        feats = cap.features()[0]
    H = model.config.hidden_size
    save_file({"input_ids": ids.contiguous(), "loss_mask": loss_mask, "features": feats[:, :-H].contiguous(),
               "last_hidden": feats[:, -H:].contiguous(), "layer_ids": torch.tensor(layer_ids)}, str(path))


def time_steps(step, steps: int, warmup: int) -> dict:
    """Wall seconds per step, and CPU seconds per step (all threads): the CPU time is what stays comparable when
    other jobs share the machine."""
    for _ in range(warmup):
        step()
    wall, cpu = [], []
    with PeakRSS() as mem:
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {"step_s": wall, "cpu_s": cpu, "peak_mb": mem.peak_mb}


def bench_flashdraft(path: Path, steps: int, warmup: int, device: str = "cpu", impl: str = "sdpa",
                     head_dtype: str = "float32") -> dict:
    import torch
    from safetensors.torch import load_file

    from flashdraft.config import load_config
    from flashdraft.drafter.attention import BlockLayout
    from flashdraft.drafter.loss import block_labels, dflash_loss
    from flashdraft.drafter.model import build_drafter
    from flashdraft.target import load_hf_config

    torch.set_num_threads(THREADS)
    b = load_file(str(path))
    cfg = load_config(preset="smollm2-local", overrides={"drafter.num_layers": 1, "drafter.block_size": BLOCK,
                                                         "drafter.max_anchors": ANCHORS,
                                                         "drafter.loss_normalization": "mask"})
    model = build_drafter(cfg, load_hf_config(cfg.target), seed=0, attn_impl=impl, device=device).train()
    if head_dtype == "bfloat16":  # drafter.head_dtype=bfloat16: bf16 logits GEMMs, fp32 softmax/CE
        model.set_frozen(model.embed_weight.bfloat16(), model.lm_head_weight.bfloat16())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=6e-4)
    ids, lm = b["input_ids"].long(), b["loss_mask"].bool()
    feats = b["features"].float().to(device)
    gen = torch.Generator().manual_seed(0)
    cand = (lm[:-1] & lm[1:])[: SEQ - BLOCK].nonzero().flatten()
    anchors = cand[torch.randperm(cand.numel(), generator=gen)[:ANCHORS]].sort().values
    labels, valid = (t.to(device) for t in block_labels(ids, lm, anchors, BLOCK))
    ids, anchors, pos = ids.to(device), anchors.to(device), torch.arange(SEQ, device=device)
    cuda = device.startswith("cuda")
    losses = []

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            hidden = model(feats, BlockLayout(SEQ, BLOCK, anchors), pos, ids[anchors], anchors)
        out = dflash_loss(hidden, model.lm_head_weight, labels, valid, GAMMA, "mask")
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))  # also synchronises CUDA

    r = time_steps(step, steps, warmup)
    if cuda:
        r["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    name = "flashdraft" + (f" {device} {impl}" if cuda else "") + (" bf16 head" if head_dtype == "bfloat16" else "")
    return {"impl": name, **r, "first_loss": losses[0]}


def bench_speculators(path: Path, steps: int, warmup: int) -> dict:
    """Runs inside .venv-bench."""
    import torch
    from safetensors.torch import load_file
    from speculators.losses.utils import resolve_loss_config
    from speculators.models.dflash import DFlashDraftModel
    from speculators.train.cli import create_transformer_layer_config

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    b = load_file(str(path))
    verifier = os.environ["FLASHDRAFT_BENCH_VERIFIER"]
    layer_cfg = create_transformer_layer_config(verifier, num_layers=1, draft_arch="qwen3", hidden_act=None,
                                                sliding_window=2048, full_attention_indices=[0])
    aux_ids = [i + 1 for i in b["layer_ids"].tolist()]  # speculators/vLLM ids = z-lab ids + 1
    model = DFlashDraftModel.from_training_args(
        layer_cfg, draft_vocab_size=layer_cfg.vocab_size, block_size=BLOCK, target_layer_ids=aux_ids,
        verifier_name_or_path=verifier, mask_token_id=int(os.environ.get("FLASHDRAFT_BENCH_MASK_ID", "2")),
        draft_attn_impl="sdpa").float().train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=6e-4)
    loss_config = resolve_loss_config("ce", "eager")
    T = b["input_ids"].numel()
    kw = {"hidden_states": b["features"].float()[None], "input_ids": b["input_ids"].long()[None],
          "loss_mask": b["loss_mask"].long()[None], "verifier_last_hidden_states": b["last_hidden"].float()[None],
          "document_ids": torch.zeros(1, T, dtype=torch.long), "loss_config": loss_config, "gamma": GAMMA,
          "max_anchors": ANCHORS}
    losses = []

    def step():
        _, loss, _ = model(**kw)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))

    return {"impl": "speculators 0.9.0", **time_steps(step, steps, warmup), "first_loss": losses[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--peer", type=Path, default=None, help=argparse.SUPPRESS)  # internal: run the peer side
    args = ap.parse_args()
    if args.peer is not None:
        print(json.dumps(bench_speculators(args.peer, args.steps, args.warmup)))
        return

    from flashdraft.config import load_config
    from flashdraft.target import cache_dir, resolve_model_dir

    batch = cache_dir() / "bench" / f"train-batch-smollm2-{SEQ}.safetensors"
    if not batch.is_file():
        batch.parent.mkdir(parents=True, exist_ok=True)
        print(f"building the benchmark batch (greedy generation + feature capture) -> {batch}", flush=True)
        make_batch(batch)
    results = [bench_flashdraft(batch, args.steps, args.warmup)]
    if BENCH_PY.is_file():
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "FLASHDRAFT_BENCH_VERIFIER": str(
            resolve_model_dir(load_config(preset="smollm2-local").target))}
        proc = subprocess.run([str(BENCH_PY), __file__, "--peer", str(batch), "--steps", str(args.steps),
                               "--warmup", str(args.warmup)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit("speculators side failed (see above)")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    else:
        print(f"{BENCH_PY} missing: run `make bench-venv` for the side-by-side with speculators", file=sys.stderr)
    results.append(bench_flashdraft(batch, args.steps, args.warmup, head_dtype="bfloat16"))
    import torch

    if torch.cuda.is_available():  # GPU: the FlexAttention block mask vs the dense SDPA mask (GPU memory in MB)
        results += [bench_flashdraft(batch, args.steps, args.warmup, "cuda", impl) for impl in ("sdpa", "flex")]

    tokens = SEQ  # sequence tokens per step (the same batch for both)
    print(f"\nDFlash training step, CPU reference geometry: seq {SEQ}, {ANCHORS} anchors, block {BLOCK}, "
          f"1 layer, {THREADS} threads, median of {args.steps}")
    print(f"{'implementation':<28}{'median s/step':>14}{'CPU s/step':>12}{'tokens/s':>10}{'peak MB':>9}"
          f"{'first loss':>12}")
    for r in results:
        r["median_s"] = statistics.median(r["step_s"])
        r["median_cpu_s"] = statistics.median(r["cpu_s"])
        r["tokens_per_s"] = tokens / r["median_s"]
        print(f"{r['impl']:<28}{r['median_s']:>14.3f}{r['median_cpu_s']:>12.3f}{r['tokens_per_s']:>10.0f}"
              f"{r['peak_mb']:>9.0f}{r['first_loss']:>12.3f}")
    summary = {"geometry": {"seq": SEQ, "anchors": ANCHORS, "block": BLOCK, "threads": THREADS},
               "load_avg": os.getloadavg(), "results": results}
    peer = next((r for r in results if r["impl"].startswith("speculators")), None)
    if peer is not None:
        print(f"speedup over speculators (target >= 1.5x), load average {os.getloadavg()[0]:.1f}:")
        for r in results:
            if r is not peer and not r["impl"].startswith("flashdraft cuda"):
                wall, cpu = peer["median_s"] / r["median_s"], peer["median_cpu_s"] / r["median_cpu_s"]
                summary.setdefault("speedup", {})[r["impl"]] = {"wall": wall, "cpu": cpu}
                print(f"  {r['impl']:<26} wall {wall:.2f}x   CPU time {cpu:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
