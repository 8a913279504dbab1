"""The command: every section with CUDA (or, in the CPU-half tests, the CPU) as the device side, one table."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import gpu_check
from flashdraft.perf.calibration import save_calibration
from gpu_check.calibration import calibration
from gpu_check.checks import Report
from gpu_check.production import DryRun, production
from gpu_check.sections import (
    EXTRACT_TOL,
    LOSS_TOL,
    Q4_DEFER_TOL,
    evaluate,
    extract,
    layer_errors,
    loss_gaps,
    matmul_tflops,
    peak_tflops,
    q4_groups,
    rows_of,
    samples_from,
    throughput,
    train,
)
from gpu_check.targets import TINY, WIDE, TargetSpec, build_target, random_rows, run_config


@dataclass
class Sizes:
    rows: int = 48                      # extraction/training rows of the small target
    lengths: tuple[int, int] = (200, 600)
    steps: int = 12                     # training steps compared with the CPU
    eval_prompts: int = 8
    new_tokens: int = 48


def run(work: Path, device: str, targets: tuple[TargetSpec, ...] = (TINY, WIDE), sizes: Sizes = Sizes()) -> Report:
    """Sections 1-4 with `device` as the device side. The first target gets the extraction, training-loss and
    evaluation checks; later ones (realistic width) extraction and, on CUDA, the training throughput."""
    report = Report()
    cuda = device.startswith("cuda")
    for spec in targets:
        first = spec is targets[0]
        folder = build_target(spec, work / spec.name, device=device if cuda else "cpu",
                              dtype="float32" if first else "bfloat16")
        # two draft layers, the second sliding (window 48 < the rows): flex's windowed block mask meets dense SDPA's
        cfg = run_config(folder, spec, work, drafter_layers=2, sliding_window=48,
                         layer_types=["full_attention", "sliding_attention"])
        rows = random_rows(sizes.rows if first else 12, sizes.lengths, spec.vocab, seed=1)
        ref, ref_tps = extract(cfg, rows, "cpu")
        got, got_tps = extract(cfg, rows, device)
        errs = layer_errors(ref, got)
        for lid, e in zip(cfg.layer_ids(), errs, strict=True):
            report.add(f"extract/{spec.name}/layer{lid}", e, EXTRACT_TOL, "rel. error vs CPU fp32")
        report.add(f"extract/{spec.name} tokens/s", got_tps, None, f"{device} (CPU fp32: {ref_tps:,.0f})")
        samples = samples_from(rows, ref)
        if first:
            groups = rows_of(samples, cfg.training.tokens_per_step)
            steps = sizes.steps
            cpu_losses, _, _ = train(cfg, groups, "cpu", steps)
            dev_losses, _, trained = train(cfg, groups, device, steps)
            gaps = loss_gaps(cpu_losses, dev_losses)
            worst = max(range(steps), key=lambda k: gaps[k])
            report.add(f"train/{spec.name} loss gap", gaps[worst], LOSS_TOL,
                       f"worst of {steps} steps (step {worst}: {dev_losses[worst]:.4f} vs CPU {cpu_losses[worst]:.4f})")
            host, deferred = q4_groups(groups, len(cfg.layer_ids()))
            q4_host, _, _ = train(cfg, host, device, 2)
            q4_dev, _, _ = train(cfg, deferred, device, 2)
            report.add(f"train/{spec.name} q4 decoded on {device.split(':')[0]}", max(loss_gaps(q4_host, q4_dev)),
                       Q4_DEFER_TOL, "loss gap of 2 steps on q4 features the trainer decoded on the device "
                       "(training.feature_decode=device) vs decoded on the host")
            bad, ties, tau = evaluate(cfg, trained, rows[: sizes.eval_prompts], device, sizes.new_tokens)
            report.add(f"evaluate/{spec.name} lossless", float(len(bad)), 0.0,
                       f"mismatching prompts ({len(ties)} numerical ties); tau {tau}")
        elif cuda:
            wide = run_config(folder, spec, work, drafter_layers=1, block_size=16, max_anchors=128,
                              tokens_per_step=8192, lr=1e-4, sliding_window=2048)  # the production window
            rows_w = random_rows(16, (1500, 2500), spec.vocab, seed=2)
            feats_w, tps = extract(wide, rows_w, device)
            report.add(f"extract/{spec.name} tokens/s, long rows", tps, None,
                       f"{sum(len(r.input_ids) for r in rows_w):,} tokens, forward_tokens {wide.features.batch_tokens}")
            t = throughput(wide, samples_from(rows_w, feats_w), device, steps=8)
            report.add(f"train/{spec.name} tokens/s", t.tokens_per_s, None,
                       f"~{t.anchors_per_row:.0f} anchors x 16 per {wide.training.tokens_per_step}-token row, "
                       f"step {t.step_s * 1e3:.0f} ms")
            peak = peak_tflops(torch.cuda.get_device_name())
            measured = matmul_tflops(device)
            report.add(f"train/{spec.name} TFLOP/s", t.tflops, None,
                       (f"{t.tflops / peak[1]:.1%} of {peak[0]} bf16 peak {peak[1]:.0f}; " if peak else "")
                       + f"{t.tflops / measured:.1%} of a bf16 matmul here ({measured:.0f})")
            report.add(f"train/{spec.name} loss finite", 0.0 if all(map(math.isfinite, t.losses)) else math.inf,
                       0.0, f"losses {t.losses[0]:.3f} -> {t.losses[-1]:.3f}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=gpu_check.__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="the device side (cuda; cpu only to exercise the script)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="tiny target only, few rows and steps")
    parser.add_argument("--cpu-threads", type=int, default=None, help="torch CPU threads for the CPU reference")
    parser.add_argument("--production", action=argparse.BooleanOptionalAction, default=None,
                        help="section 5, the production shapes (default: on with CUDA; on CPU a toy-width dry run)")
    parser.add_argument("--only-production", action="store_true", help="skip sections 1-4")
    parser.add_argument("--json", default=None, help="write the calibration file (flashdraft plan --calibrate) here")
    parser.add_argument("--commit", default=os.environ.get("FLASHDRAFT_COMMIT"),
                        help="the flashdraft commit, recorded in the calibration file (default $FLASHDRAFT_COMMIT)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: no CUDA device visible to torch", file=sys.stderr)
        return 2
    start = time.perf_counter()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    quick = Sizes(rows=8, lengths=(48, 160), steps=4, eval_prompts=4, new_tokens=16)
    cuda = args.device.startswith("cuda")
    report = Report() if args.only_production else run(work, args.device, (TINY,) if args.quick else (TINY, WIDE),
                                                       quick if args.quick else Sizes())
    if args.production if args.production is not None else cuda:
        prod = production(report, work, args.device, None if cuda else DryRun())
        if args.json:
            print(f"calibration: {save_calibration(calibration(prod, args.device, args.commit), args.json)}")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"\ngpu-check on {name} (torch {torch.__version__}), {time.perf_counter() - start:.0f} s\n")
    print(report.table())
    print("\nPASS" if report.ok else "\nFAIL")
    return 0 if report.ok else 1
