"""The CPU half of `make gpu-check` (benchmarks/gpu_check): its reference computations, comparisons, FLOP count,
table and exit status, with the device side on CPU and micro targets (the GPU run itself needs a GPU)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the gpu_check package

from gpu_check.bootstrap import bootstrap  # noqa: E402  (after the path fix)

bootstrap()

from gpu_check import cli, production, sections, targets  # noqa: E402  (after the bootstrap, as __main__.py)
from gpu_check.checks import Report  # noqa: E402

MICRO = targets.TargetSpec("micro", 8, 64, 4, 2, 16, 128, 512)
MICRO_WIDE = targets.TargetSpec("micro-wide", 8, 96, 6, 2, 16, 192, 640)
SIZES = cli.Sizes(rows=4, lengths=(24, 64), steps=2, eval_prompts=1, new_tokens=8)


def test_gpu_check_cpu_half_end_to_end(tmp_path):
    report = cli.run(tmp_path, "cpu", (MICRO, MICRO_WIDE), SIZES)
    names = [c.name for c in report.checks]
    assert [f"extract/micro/layer{i}" for i in (1, 2, 3, 4, 5)] == names[:5]
    assert {"train/micro loss gap", "train/micro q4 decoded on cpu", "evaluate/micro lossless",
            "extract/micro-wide/layer5"} <= set(names)
    # the device side is the CPU here: the same computation, so every comparison is exact
    assert report.ok and all(c.value == 0 for c in report.checks if c.limit is not None)
    assert "FAIL" not in report.table()


def test_gpu_check_comparisons_catch_mismatches(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    ref = [torch.randn(10, 3, 8), torch.randn(7, 3, 8)]
    got = [r.clone() for r in ref]
    got[1][:, 2] += 0.5 * ref[1][:, 2]  # layer 2 of one sample off by 50%
    errs = sections.layer_errors(ref, got)
    assert errs[:2] == [0.0, 0.0] and 0.2 < errs[2] < 0.5
    with pytest.raises(ValueError, match="feature shapes differ"):
        sections.layer_errors(ref, [ref[0], ref[1][:6]])
    assert sections.loss_gaps([2.0, 4.0], [2.1, math.nan]) == pytest.approx([0.05, math.inf])

    report = Report()
    report.add("extract/x/layer1", errs[2], sections.EXTRACT_TOL)
    report.add("train/x loss gap", math.nan, sections.LOSS_TOL)
    report.add("train/x tokens/s", 123.0)
    assert [c.ok for c in report.checks] == [False, False, True] and not report.ok
    assert report.table().count("FAIL") == 2 and "info" in report.table()
    monkeypatch.setattr(cli, "run", lambda *a, **k: report)
    assert cli.main(["--device", "cpu", "--work", str(tmp_path)]) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAIL")


def test_gpu_check_tolerance_admits_bf16_but_sees_it(tmp_path):
    """The extraction tolerance is above what bf16 does to features (measured here on CPU), and the comparison
    does see bf16 (a nonzero error): the check compares something."""
    cfg = targets.run_config(targets.build_target(MICRO, tmp_path / "m"), MICRO, tmp_path)
    rows = targets.random_rows(4, (32, 64), MICRO.vocab, seed=3)
    ref, _ = sections.extract(cfg, rows, "cpu")
    bf16 = cfg.model_copy(update={"target": cfg.target.model_copy(update={"dtype": "bfloat16"})})
    errs = sections.layer_errors(ref, sections.extract(bf16, rows, "cpu")[0])
    assert all(1e-4 < e < sections.EXTRACT_TOL for e in errs), errs


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "dflash2-detached"])
def test_gpu_check_step_flops_match_torch_flop_counter(tmp_path, kind):
    """The FLOP model behind the TFLOP/s figure (flashdraft/perf/flops.py on the row trained) equals what torch counts
    for the projections, MLP and head of one real training step (torch does not count masked SDPA; ours counts the
    allowed pairs only); for DFlash2 also its block convolutions and candidate selector, detached or not."""
    from torch.utils.flop_counter import FlopCounterMode

    from flashdraft.components.train.distributed import DistEnv
    from flashdraft.components.train.trainer import build_model, micro_step
    from flashdraft.drafter.batch import pack
    from flashdraft.perf.flops import trainer_flops

    cfg = targets.run_config(targets.build_target(MICRO, tmp_path / "m"), MICRO, tmp_path, drafter_layers=2,
                             block_size=4, max_anchors=12)
    if kind != "dflash":
        cfg = cfg.with_overrides({"drafter.kind": "dflash2", "drafter.selector_rank": 16, "drafter.selector_top_k": 8,
                                  "drafter.conv_group_size": 16, "drafter.conv_kernel_size": 3,
                                  "drafter.selector_detach": kind == "dflash2-detached"})
    rows = targets.random_rows(3, (40, 60), MICRO.vocab, seed=4)
    samples = sections.samples_from(rows, sections.extract(cfg, rows, "cpu")[0])
    model = build_model(cfg, DistEnv(0, 1, 0, torch.device("cpu")))
    with FlopCounterMode(display=False) as counter:
        micro_step(model, model, samples, cfg, 0, torch.device("cpu"), 1.0, sync=True)
    counts = counter.get_flop_counts()["Global"]
    matmul = sum(v for op, v in counts.items() if "attention" not in str(op))
    batch = pack(samples, 4, 12, seed=cfg.training.seed, epoch=0, max_tokens=cfg.training.tokens_per_step)
    g = model.geometry
    shape = sections.train_shape(g, cfg, cuda=False)
    ours = sections.row_flops(shape, g, batch)
    assert ("DFlash2 selector" in ours) == (kind != "dflash")
    assert sum(v for k, v in ours.items() if k != "attention") == pytest.approx(matmul, rel=0.01), (ours, counts)
    queries = int(batch.anchors.numel()) * 4
    dense = 3 * 4 * g.head_dim * g.num_heads * queries * (batch.num_tokens + queries) * g.num_layers
    assert 0 < ours["attention"] < dense / 2  # the DFlash mask allows well under half of the pairs
    # the planner's estimate from the shape alone, told this row's size and anchors (its loss rows assume every
    # drafted slot is scored: a few past a sample's end are not, hence 3%)
    planned = trainer_flops(shape.model_copy(update={"tokens_per_step": batch.num_tokens,
                                                     "anchors_per_row": int(batch.anchors.numel())}), window_keys=0)
    assert planned.keys() == ours.keys()
    assert sum(v for k, v in planned.items() if k != "attention") == pytest.approx(matmul, rel=0.03)


def test_gpu_check_throughput_path_runs_on_cpu(tmp_path):
    """The realistic-width throughput measurement (CUDA-only in the script) on the micro target: rows packed as the
    trainer packs them, compile steps excluded, FLOPs of the rows actually trained."""
    cfg = targets.run_config(targets.build_target(MICRO, tmp_path / "m"), MICRO, tmp_path, block_size=4, max_anchors=8,
                        tokens_per_step=128)
    rows = targets.random_rows(6, (40, 60), MICRO.vocab, seed=5)
    samples = sections.samples_from(rows, sections.extract(cfg, rows, "cpu")[0])
    assert [len(g) for g in sections.rows_of(samples, 128)] == [2, 2, 2]
    t = sections.throughput(cfg, samples, "cpu", steps=4, warmup=1)
    assert t.tokens_per_s > 0 and t.tflops > 0 and 0 < t.anchors_per_row <= 16
    assert len(t.losses) == 4 and all(math.isfinite(x) for x in t.losses)


def test_gpu_check_production_dry_run_writes_a_calibration_file(tmp_path, capsys):
    """Section 5 (the production shapes) through its CPU dry run: the production preset's own config keys at toy
    widths, every activation-checkpointing choice trained, the extraction prefill of the hybrid architecture, and
    a calibration file that `flashdraft plan --calibrate` reads."""
    from flashdraft.perf.calibration import load_calibration

    out = tmp_path / "calibration.json"
    assert cli.main(["--device", "cpu", "--only-production", "--production", "--work", str(tmp_path),
                    "--json", str(out), "--commit", "abc1234"]) == 0
    table = capsys.readouterr().out
    for mode in production.RECOMPUTE:
        assert f"train/qwen3.6-27b recompute={mode} tokens/s" in table
    assert "extract/qwen3.6-27b tokens/s" in table
    assert "decode/fp8 on cpu" in table and table.count("decode/") >= 5  # section 6: every q4 candidate and fp8
    cal = load_calibration(out)
    train = cal.rates.train
    assert train.tokens_per_s_per_gpu > 0 and train.flops_per_token > 0
    assert (train.shape.tokens_per_step, train.shape.block_size, train.shape.num_layers) == (512, 16, 2)
    assert 0 < train.shape.anchors_per_row <= 24 * 12
    dry = production.production_config(tmp_path / "qwen3.6-27b-head", tmp_path, **production.DryRun().overrides)
    assert cal.rates.extract.shape.layers_run == max(dry.layer_ids(8)) + 1
    assert cal.source.commit == "abc1234"


def test_gpu_check_production_out_of_memory_is_a_row_not_a_crash(tmp_path, monkeypatch):
    """A configuration that runs out of memory is reported (and the next one still runs)."""
    from flashdraft.components.train import trainer

    real = trainer.drafter_loss
    calls = []

    def loss_or_oom(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 30.90 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "drafter_loss", loss_or_oom)
    results, _ = production.production_train(tmp_path, "cpu", production.DryRun(), steps=2, warmup=1,
                                             recompute=("none", "layer"))
    assert results[0].oom and "30.90 GiB" in results[0].oom and results[0].tokens_per_s == 0
    assert results[1].oom is None and results[1].tokens_per_s > 0
