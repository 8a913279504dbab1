"""4-bit feature codecs measured, not named (issue 24): the candidates' bytes, error per layer and decode speed.

For each candidate (`CANDIDATES`: q4 parameter sets, with fp8 / fp8-zstd / bf16-zstd beside them):

1. bytes per token for the Qwen3.6-27B geometry (the codec's own accounting, what `flashdraft plan` prints) and its
   ratio to bf16 (goal <= 0.27x);
2. median relative error per layer (||decoded - x|| / ||x|| per token) on real features: SmolLM2-135M (the
   smollm2-local layers, massive activations in the deep layers) and the tiny Qwen3.5 hybrid (random weights,
   Gated DeltaNet + gated attention layers), captured through extraction's hooks from demo prompts;
3. CPU decode GB/s of bf16 output on one thread, with the ratio to the fp8 decoder: the median over rounds that
   alternate the two (absolute figures swing with load; the ratio much less).

The GPU decode throughput (torch ops on the device, from host bytes) is `gpu_decode_check`, called by
benchmarks/gpu_check; this script runs it too when a GPU is present.

Run: `.venv/bin/python benchmarks/bench_codecs.py [--prompts 16] [--json out.json]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from flashdraft.features.codecs import Codec, relative_error_per_layer

# label -> codec parameters. NVFP4's own layout (e4m3 scale per 16) is 0.28x of bf16: over the size goal, kept as
# the reference; the others cost 4.25 bits a value (+ outliers: 32 bits per kept value per row).
_FP4 = {"name": "q4", "q4_values": "e2m1", "q4_block": 32, "q4_scale": "e4m3", "q4_outliers": 0}
CANDIDATES: dict[str, dict] = {
    "nvfp4 (e2m1, e4m3/16)": {**_FP4, "q4_block": 16},
    "fp4 e2m1, e4m3/32": _FP4,
    "mxfp4 (e2m1, e8m0/32)": {**_FP4, "q4_scale": "e8m0"},
    "int4, bf16/64": {**_FP4, "q4_values": "int4", "q4_block": 64, "q4_scale": "bf16"},
    "nf4, bf16/64": {**_FP4, "q4_values": "nf4", "q4_block": 64, "q4_scale": "bf16"},
    "fp4 e4m3/32 + 2 outliers": {**_FP4, "q4_outliers": 2},
    "fp4 e4m3/32 + 8 outliers": {**_FP4, "q4_outliers": 8},
    "nf4 bf16/64 + 8 outliers": {**_FP4, "q4_values": "nf4", "q4_block": 64, "q4_scale": "bf16", "q4_outliers": 8},
    "fp4 e4m3/32 + Hadamard 64": {**_FP4, "q4_rotate": 64},
}
REFERENCES: dict[str, dict] = {"bf16-zstd": {"name": "bf16-zstd"}, "fp8": {"name": "fp8"},
                               "fp8 block64": {"name": "fp8", "fp8_scale": "block64"},
                               "fp8-zstd": {"name": "fp8-zstd"}}
QWEN36 = {"hidden": 5120, "layers": 5}  # Qwen3.6-27B's feature geometry


def codec(params: dict) -> Codec:
    return Codec.from_params(params)


def capture(preset: str, prompts: int) -> tuple[torch.Tensor, list[int]]:
    """Features [T, n, H] (bf16) of `prompts` demo prompts (chat template applied) through extraction's hooks."""
    from flashdraft.components.prep.demo import demo_rows
    from flashdraft.config import load_config
    from flashdraft.target.capture import capture_layers
    from flashdraft.target.model import load_causal_lm, load_tokenizer

    cfg = load_config(preset=preset)
    tok, model = load_tokenizer(cfg.target), load_causal_lm(cfg.target)
    ids = cfg.layer_ids()
    out = []
    with torch.inference_mode(), capture_layers(model, ids, stop_after_deepest=True) as cap:
        for row in demo_rows()[:prompts]:
            text = tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
            x = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
            cap.forward(input_ids=x)
            out.append(cap.features()[0].reshape(x.shape[1], len(ids), -1).to(torch.bfloat16))
    return torch.cat(out), ids


def decode_gbs(c: Codec, feats: torch.Tensor, device: str | None = None, repeats: int = 7) -> float:
    """GB/s of bf16 output decoding `feats` (one blob per 256 tokens, as samples are), median of `repeats`."""
    blobs = [(c.encode(f), f.shape) for f in feats.split(256)]
    cuda = device is not None and device.startswith("cuda")
    rates = []
    for _ in range(repeats + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b, shape in blobs:
            c.decode(b, *shape, device=device)
        if cuda:
            torch.cuda.synchronize()
        rates.append(feats.numel() * 2 / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates[1:])  # the first pass warms caches and CUDA kernels


def synthetic(tokens: int, layers: int, hidden: int, seed: int = 0) -> torch.Tensor:
    """Feature-like values: per-channel scales, a massive-activation channel and a 300x first token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, layers, hidden, generator=g) * torch.rand(hidden, generator=g).add_(0.1)
    x[:, :, 7] *= 60.0
    x[0] *= 300.0
    return x.to(torch.bfloat16)


def gpu_decode_check(device: str = "cuda", tokens: int = 4096, layers: int = QWEN36["layers"],
                     hidden: int = QWEN36["hidden"]) -> list[dict]:
    """For every q4 candidate and fp8: decode on `device` from host bytes (GB/s of bf16 output) and the count of
    values that differ from the CPU decode (must be 0: the q4 decode is a table lookup and one correctly rounded
    bf16 multiply on both; the rotation's float32 matmul may differ in the last bit, so rotated candidates
    report the max relative difference instead). Rows: {codec, gbs, cpu_gbs, mismatches, max_rel_diff}."""
    feats = synthetic(tokens, layers, hidden)
    rows = []
    for label, params in {**CANDIDATES, "fp8": REFERENCES["fp8"]}.items():
        c = codec(params)
        blob = c.encode(feats)
        ref = c.decode(blob, tokens, layers, hidden)
        got = c.decode(blob, tokens, layers, hidden, device=device).cpu()
        diff = (got.float() - ref.float()).abs()
        rows.append({"codec": label, "gbs": decode_gbs(c, feats, device), "cpu_gbs": decode_gbs(c, feats, None, 3),
                     "mismatches": int((got.view(torch.int16) != ref.view(torch.int16)).sum()),
                     "max_rel_diff": float(diff.max() / ref.float().abs().max()),
                     "exact_expected": not params.get("q4_rotate")})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16, help="demo prompts whose features are measured")
    ap.add_argument("--decode-tokens", type=int, default=2048, help="SmolLM2 tokens decoded for the GB/s figures")
    ap.add_argument("--decode-rounds", type=int, default=5, help="alternating fp8/candidate decode rounds")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    everything = {**REFERENCES, **CANDIDATES}
    feats = {name: capture(preset, args.prompts) for name, preset in
             (("SmolLM2-135M", "smollm2-local"), ("tiny Qwen3.5 hybrid", "tiny-qwen35"))}
    results: dict = {"codecs": {}}
    for label, params in everything.items():
        c = codec(params)
        bpt = c.raw_bytes_per_token(QWEN36["hidden"], QWEN36["layers"])
        row = {"params": c.params(), "qwen36_raw_bytes_per_token": bpt,
               "qwen36_ratio": bpt / (2 * QWEN36["hidden"] * QWEN36["layers"]), "errors": {}}
        for model, (x, ids) in feats.items():
            got = c.decode(c.encode(x), *x.shape).reshape(x.shape)
            row["errors"][model] = dict(zip(map(str, ids), relative_error_per_layer(x, got).tolist(), strict=True))
            if model.startswith("SmolLM2"):
                row["smollm2_stored_bytes_per_token"] = len(c.encode(x)) / x.shape[0]
        results["codecs"][label] = row
    smol = feats["SmolLM2-135M"][0][: args.decode_tokens]
    for label, params in everything.items():  # fp8 and the candidate alternate: the median of pairs' ratios
        pairs = [(decode_gbs(codec(REFERENCES["fp8"]), smol, repeats=3), decode_gbs(codec(params), smol, repeats=3))
                 for _ in range(args.decode_rounds)]
        results["codecs"][label].update(decode_gbs=statistics.median(g for _, g in pairs),
                                        fp8_gbs=statistics.median(f for f, _ in pairs),
                                        decode_vs_fp8=statistics.median(g / f for f, g in pairs))
    if torch.cuda.is_available():
        results["gpu"] = gpu_decode_check()
    results["load_avg"] = list(__import__("os").getloadavg())

    print(f"\nBytes per token (Qwen3.6-27B geometry, bf16 = {2 * QWEN36['hidden'] * QWEN36['layers']:,}; zstd codecs "
          f"before zstd: see plan.zstd_ratio) and median relative error per layer on real features "
          f"({args.prompts} demo prompts)")
    models = list(feats)
    print("| codec | B/token (Qwen3.6-27B) | x bf16 | " + " | ".join(
        f"{m} error, layers {feats[m][1]}" for m in models) + " | CPU decode GB/s (1 thread) | vs fp8 |")
    print("|---|---:|---:|" + "---|" * len(models) + "---:|---:|")
    for label, r in results["codecs"].items():
        errs = [", ".join(f"{e:.3f}" for e in r["errors"][m].values()) for m in models]
        print(f"| {label} | {r['qwen36_raw_bytes_per_token']:,} | {r['qwen36_ratio']:.3f} | " + " | ".join(errs)
              + f" | {r['decode_gbs']:.2f} | {r['decode_vs_fp8']:.2f}x |")
    print(f"(CPU timings under load: load average {results['load_avg'][0]:.1f}; the ratio to fp8 is measured "
          f"interleaved in the same run)")
    if "gpu" in results:
        print("\n| codec | GPU decode GB/s | CPU GB/s | values != CPU decode |\n|---|---:|---:|---:|")
        for r in results["gpu"]:
            print(f"| {r['codec']} | {r['gbs']:.1f} | {r['cpu_gbs']:.2f} | {r['mismatches']} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
