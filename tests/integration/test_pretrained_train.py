"""Training on from a pretrained drafter: a run started from another run's z-lab export begins where that drafter
ended (its held-out curve's first point is the source's last, on the same held-out samples), trains on, and names
its parent; a DFlash export starts a DFlash2 run the same way."""

from __future__ import annotations

import pytest
from support.rule_shards import rule_sequences, train_cfg, write_shards

from flashdraft.components.export.export import run_export
from flashdraft.components.train.trainer import run_train


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_training_on_starts_from_the_exported_drafter(tiny_cfg, tmp_path, kind):
    over = {"training.epochs": 2, "training.checkpoint_every": 100, "training.heldout_samples": 8,
            "training.heldout_every": 3, "export.dtype": "float32"}
    source = train_cfg(tiny_cfg, run_id="source", **over)
    seqs = rule_sequences(40, seed=8)
    write_shards(source, seqs)
    before = run_train(source)
    run_export(source, out_dir=tmp_path / "export")
    child = source.with_overrides({"run_id": f"child-{kind}", "drafter.init": "pretrained", "training.max_steps": 3,
                                   "drafter.init_from": str(tmp_path / "export" / "zlab"), "drafter.kind": kind,
                                   "drafter.conv_group_size": 64})
    write_shards(child, seqs)
    after = run_train(child)
    assert after.parent.source == str(tmp_path / "export" / "zlab") and after.parent.format == "zlab"
    assert before.parent is None
    start, end = after.heldout[0], before.heldout[-1]
    assert start["step"] == 0 and after.heldout_samples == before.heldout_samples
    # the same weights on the same held-out samples (a new DFlash2 selector starts neutral: it walks the argmax)
    assert start["tau"] == pytest.approx(end["tau"], abs=1e-6)
    assert start["acc_by_pos"] == pytest.approx(end["acc_by_pos"], abs=1e-6)
    assert after.steps == 3 and after.heldout[-1]["step"] == 3
    assert (after.dflash2_initialised > 0) == (kind == "dflash2") and before.dflash2_initialised == 0
    line = after.headline(after.figures())
    assert line.endswith("trained on from a pretrained drafter" + (
        f" (DFlash checkpoint: {after.dflash2_initialised} DFlash2 tensors initialised)" if kind == "dflash2" else ""))
