"""The held-out curve during training (components/train/heldout.py) on real feature shards of the tiny target:
held-out samples are never trained on, the curve is recorded every N steps and rises as the drafter learns, its
accuracy equals an independent evaluation of the same checkpoint, and a resumed run draws the same curve."""

from __future__ import annotations

import pytest
from support.rule_shards import rule_sequences, train_cfg, write_shards

from flashdraft.components.train.heldout import select_heldout
from flashdraft.components.train.trainer import evaluate_samples, run_train
from flashdraft.drafter.persistence import load_drafter
from flashdraft.features.reader import open_reader
from flashdraft.storage.store import open_store


@pytest.mark.slow  # 40 optimizer steps plus 6 held-out points: ~1-3 min on 2 quiet cores, 20+ min under load
@pytest.mark.timeout(3600)
def test_the_heldout_curve_rises_on_samples_never_trained_on(tiny_cfg):
    cfg = train_cfg(tiny_cfg, **{"training.epochs": 8, "training.checkpoint_every": 100,
                                 "training.heldout_samples": 16, "training.heldout_every": 8})
    write_shards(cfg, rule_sequences(96, seed=5))
    summary = run_train(cfg)
    assert summary.steps == 8 * (80 // 16)  # 96 - 16 held out, 16 samples a row
    reader = open_reader(cfg)
    held = {sid for _, _, sid in select_heldout(reader, 16)}
    assert set(summary.heldout_samples) == held and len(held) == 16
    reader.exclude = frozenset(held)
    assert held.isdisjoint(s.sample_id for s in reader)  # what the trainer read per epoch

    curve = summary.heldout
    assert [p["step"] for p in curve] == [0, 8, 16, 24, 32, 40]
    first, last = curve[0], curve[-1]
    # 40 steps only start on the rule (~100 reach slot-1 accuracy > 0.3, test_train.py): the curve leaves chance
    assert last["acc_by_pos"][0] > first["acc_by_pos"][0] and last["tau"] > first["tau"], curve
    assert 1.0 <= last["tau"] <= 1.0 + sum(last["acc_by_pos"]) and all(p["blocks"] == 16 * 4 for p in curve)
    # the last point is the final checkpoint's accuracy on the held-out samples, measured independently
    store = open_store(cfg.storage, cfg.run_id)
    samples = [reader.fetch(k, i) for k, i, _ in select_heldout(reader, 16)]
    independent = evaluate_samples(load_drafter(store, prefix=summary.checkpoint), samples, cfg)
    for a, b in zip(last["acc_by_pos"], independent["acc_by_pos"], strict=True):
        assert abs(a - b) < 1e-4
    assert summary.figures()["heldout_tau"] == last["tau"]


def test_a_resumed_run_draws_the_same_heldout_curve(tiny_cfg):
    over = {"training.epochs": 2, "training.checkpoint_every": 2, "training.heldout_samples": 8,
            "training.heldout_every": 2}
    full = train_cfg(tiny_cfg, run_id="h-full", **over)
    part = full.with_overrides({"run_id": "h-part"})
    seqs = rule_sequences(56, seed=6)
    write_shards(full, seqs)
    write_shards(part, seqs)
    a = run_train(full)
    run_train(part, stop_after=3)  # checkpoint at 2 holds the curve's points 0 and 2; step 3 is lost
    b = run_train(part)
    assert [p["step"] for p in a.heldout] == [0, 2, 4, 6] == [p["step"] for p in b.heldout]
    for pa, pb in zip(a.heldout, b.heldout, strict=True):
        assert abs(pa["tau"] - pb["tau"]) < 1e-6 and pa["blocks"] == pb["blocks"] > 0


def test_holding_out_every_sample_is_refused(tiny_cfg):
    from flashdraft.components.train.schedule import TrainError

    cfg = train_cfg(tiny_cfg, **{"training.heldout_samples": 24})
    write_shards(cfg, rule_sequences(24, seed=7))
    with pytest.raises(TrainError, match="training.heldout_samples=24 would hold out all 24 extracted samples"):
        run_train(cfg)
