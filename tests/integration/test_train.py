"""Training on real feature shards (tiny target, features from flashdraft.target.capture, the shard format and the
reader): it learns, resume reproduces an uninterrupted run, and 2 gloo processes train under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load as load_bytes
from support.gloo_ranks import two_gloo_ranks
from support.rule_shards import as_samples, rule_sequences, train_cfg, write_shards

from flashdraft.components.train.distributed import DistEnv
from flashdraft.components.train.schedule import build_schedule
from flashdraft.components.train.trainer import evaluate_samples, run_train
from flashdraft.storage import layout
from flashdraft.storage.checkpoint import latest_checkpoint
from flashdraft.storage.store import open_store
from flashdraft.target.model import load_hf_config


@pytest.mark.slow  # ~100 optimizer steps: ~1-6 min on 2 cores depending on load
def test_training_learns_the_rule(tiny_cfg):
    cfg = train_cfg(tiny_cfg, **{"training.epochs": 12, "training.checkpoint_every": 50})
    write_shards(cfg, rule_sequences(128, seed=0))
    val = as_samples(cfg, rule_sequences(24, seed=99))
    from flashdraft.drafter.persistence import build_drafter, load_drafter

    untrained = evaluate_samples(build_drafter(cfg, load_hf_config(cfg.target)), val, cfg)
    summary = run_train(cfg)
    assert summary.steps == 12 * (128 // 16) and summary.world_size == 1
    store = open_store(cfg.storage, cfg.run_id)
    assert store.get_json_verified(layout.metrics_key("train"))["steps"] == summary.steps
    trained = evaluate_samples(load_drafter(store, prefix=summary.checkpoint), val, cfg)
    assert trained["loss"] < untrained["loss"] - 2.0, (untrained, trained)
    assert trained["acc_by_pos"][0] > 0.3 > 10 * untrained["acc_by_pos"][0], (untrained, trained)  # chance ~1/48
    hist = summary.history
    assert len(hist[0]["acc_by_pos"]) == cfg.drafter.block_size - 1 and hist[-1]["tokens_per_s"] > 0
    assert hist[0]["lr"] < hist[1]["lr"] and hist[-1]["lr"] < 0.1 * cfg.training.lr  # warmup, then cosine


def test_more_steps_train_on_from_the_final_checkpoint_and_fewer_are_refused(tiny_cfg):
    """Through the runner, as `flashdraft train` and every pipeline run it: a finished run is reused; raising
    training.max_steps carries on from its final checkpoint (the history continues, the first steps unchanged);
    lowering it below the checkpoint's step is refused."""
    from flashdraft.components.train.schedule import TrainError
    from flashdraft.run.runner import run_task

    cfg = train_cfg(tiny_cfg, **{"training.epochs": 2, "training.max_steps": 3})
    write_shards(cfg, rule_sequences(96, seed=1))  # 6 steps in 2 epochs
    first = run_task(cfg, "train")
    assert first.steps == 3 and run_task(cfg, "train").skipped is True
    more = run_task(cfg.with_overrides({"training.max_steps": 5}), "train")
    assert not more.skipped and more.steps == 5 and [h["step"] for h in more.history] == [1, 2, 3, 4, 5]
    assert more.history[:3] == first.history
    assert latest_checkpoint(open_store(cfg.storage, cfg.run_id))["step"] == 5
    with pytest.raises(TrainError, match="checkpoint is at step 5, past the 3 steps"):
        run_task(cfg, "train")


def _params(cfg) -> dict[str, torch.Tensor]:
    store = open_store(cfg.storage, cfg.run_id)
    return load_bytes(store.get_verified(f"{latest_checkpoint(store)['prefix']}/model.safetensors"))


DFLASH2 = {"drafter.kind": "dflash2", "drafter.selector_rank": 16, "drafter.selector_warmup": 0.2,
           "drafter.selector_ramp": 0.5}  # a warm-up and ramp: the resumed run must pick the weight up mid-ramp


RECIPE = {"training.optimizer": "muon", "drafter.loss_weights": "dpace"}  # Muon's momentum and D-PACE's weights


@pytest.mark.parametrize("vocab,kind", [(None, {}), (64, {}), (None, DFLASH2), (None, RECIPE)],
                         ids=["full-vocab", "draft-vocab", "dflash2", "muon-dpace"])
def test_interrupted_and_resumed_equals_uninterrupted(tiny_cfg, tmp_path, vocab, kind):
    seqs = rule_sequences(96, seed=1)
    full = train_cfg(tiny_cfg, **{"run_id": "full", "training.epochs": 2, "training.grad_accum": 2,
                                  "training.checkpoint_every": 2, "drafter.draft_vocab_size": vocab, **kind})
    part = full.with_overrides({"run_id": "resumed"})
    write_shards(full, seqs)
    write_shards(part, seqs)
    a = run_train(full)
    assert a.steps == 6  # 96 samples / 16 per row = 6 rows per epoch / grad_accum 2 = 3 steps, x 2 epochs
    stopped = run_train(part, stop_after=5)  # checkpoints at 2 and 4; step 5 is lost; resume mid-epoch 1
    assert stopped.dump() == {"stopped_at": 5, "total_steps": 6}
    assert latest_checkpoint(open_store(part.storage, part.run_id))["step"] == 4
    b = run_train(part)
    assert b.steps == 6 and [h["step"] for h in b.history] == list(range(1, 7))
    pa, pb = _params(full), _params(part)
    assert pa.keys() == pb.keys()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], atol=1e-6, rtol=1e-5, msg=k)
    for ha, hb in zip(a.history, b.history, strict=True):
        assert abs(ha["loss"] - hb["loss"]) < 1e-5
    if kind.get("drafter.kind") == "dflash2":  # its parts trained and were checkpointed; the selector loss entered
        # after its warm-up
        assert "candidate_selector.predecessor_codebook" in pa and "layers.0.mlp_conv.base_kernel" in pa
        assert pa["candidate_selector.hidden_projection.weight"].abs().sum() > 0
        assert [h["selector_weight"] for h in b.history] == pytest.approx([0, 0, 0.6, 2.8 / 3, 1, 1])
        # fractions, recorded every step (a 6-step random drafter's top-k may still miss every gold token: >= 0)
        assert all(0 <= h["selector_acc"] <= 1 and 0 <= h["topk_coverage"] <= 1 for h in b.history)
    if kind.get("training.optimizer") == "muon":  # Muon's momentum on the matrices, AdamW's moments on the rest
        store = open_store(part.storage, part.run_id)
        state = load_bytes(store.get_verified(f"{latest_checkpoint(store)['prefix']}/optimizer.safetensors"))
        assert "fc.weight/momentum_buffer" in state and "fc.weight/exp_avg" not in state
        assert "layers.0.input_layernorm.weight/exp_avg_sq" in state
    if vocab:  # the draft vocabulary: every response token (ids 1000..1047), then the most frequent others
        assert pa["d2t"].dtype == torch.int64 and set(range(1000, 1048)) <= set(pa["d2t"].tolist())


def test_q4_features_decoded_on_the_training_device_train_the_same_drafter_as_decoded_by_the_reader(tiny_cfg):
    """`training.feature_decode=device` (what a GPU trainer does with q4 shards: the reader yields the 4-bit
    payloads, micro_step decodes them on its device) trains bit for bit the drafter the reader-side decode does;
    here the device is the CPU, so this checks the deferred path's plumbing, not a GPU (`make gpu-check` has the
    GPU decoder's bits against the CPU's)."""
    seqs = rule_sequences(64, seed=2)
    cfgs = [train_cfg(tiny_cfg, **{"run_id": f"q4-{where}", "features.codec": "q4", "training.feature_decode": where,
                                   "training.heldout_samples": 4, "training.heldout_every": 1})
            for where in ("reader", "device")]
    for cfg in cfgs:
        write_shards(cfg, seqs)
    cpu = DistEnv(0, 1, 0, torch.device("cpu"))
    assert [build_schedule(cfg, cpu).reader.parts.defer_decode for cfg in cfgs] == [False, True]
    auto = cfgs[0].with_overrides({"training.feature_decode": "auto"})
    assert not build_schedule(auto, cpu).reader.parts.defer_decode  # auto: the device only on a GPU
    a, b = (run_train(cfg) for cfg in cfgs)
    assert a.steps == b.steps > 0
    drop_time = lambda curve: [{k: v for k, v in e.items() if k != "seconds"} for e in curve]  # noqa: E731
    assert len(a.heldout) == a.steps + 1 and drop_time(a.heldout) == drop_time(b.heldout)
    pa, pb = _params(cfgs[0]), _params(cfgs[1])
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.slow
@pytest.mark.parametrize("strategy,kind", [("ddp", "dflash"), ("fsdp2", "dflash"), ("fsdp2", "dflash2")])
def test_two_gloo_processes_under_torchrun(tiny_cfg, strategy, kind):
    """`flashdraft train` re-launches itself under torchrun; the FSDP2 DFlash case also rehearses a preemption
    (training.preempt_after: torchrun twice, the second launch resuming from the step-2 checkpoint). Each strategy
    once and DFlash2 under the sharded one (DDP with DFlash2 adds no path these do not run: ~30 s of CI)."""
    cfg = train_cfg(tiny_cfg, **{"training.nproc_per_node": 2, "training.epochs": 2})
    write_shards(cfg, rule_sequences(64, seed=2))
    sets = ["storage.root=" + cfg.storage.root, "training.nproc_per_node=2", "training.epochs=2",
            "training.tokens_per_step=768", "drafter.max_anchors=4", "drafter.block_size=4",
            f"training.strategy={strategy}", f"drafter.kind={kind}", "drafter.selector_rank=16"]
    preempt = (strategy, kind) == ("fsdp2", "dflash")
    sets += ["training.checkpoint_every=1", "training.preempt_after=2"] if preempt else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "flashdraft.cli.main", "train", "--preset", "tiny"]
    cmd += [a for s in sets for a in ("--set", s)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    store = open_store(cfg.storage, cfg.run_id)
    summary = store.get_json_verified(layout.metrics_key("train"))
    # 64 samples, 32 per rank, 16 per row -> 2 rows per rank per epoch, 2 epochs
    assert summary["world_size"] == 2 and summary["steps"] == 4 and summary["strategy"] == strategy
    assert summary["resumed_from"] == (2 if preempt else None)
    assert summary["history"][-1]["anchors"] == 2 * 16 * 4  # both ranks' rows counted
    assert json.loads(proc.stdout.strip().splitlines()[-1])["steps"] == 4
    if kind == "dflash2":  # both ranks' selector rows summed, and the checkpoint holds the selector unsharded
        assert summary["history"][-1]["selector_acc"] >= 0 and summary["drafter_kind"] == "dflash2"
        weights = _params(cfg)
        assert weights["candidate_selector.successor_codebook"].shape[1] == 16


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [{}, RECIPE], ids=["adamw", "muon-dpace"])
def test_fsdp2_preempted_and_resumed_equals_uninterrupted(tiny_cfg, recipe):
    """A 2-rank FSDP2 run killed after its step-3 checkpoint and relaunched ends with the uninterrupted run's
    weights: the full state dicts (gathered on save, scattered to the shards on load, every rank walking the keys
    in the same order) restore every shard. With Muon, its Newton-Schulz runs on the DTensor shards. DDP's
    resume: the streaming 2-rank test above."""
    strategy = "fsdp2"
    seqs = rule_sequences(64, seed=2)
    over = {"training.nproc_per_node": 2, "training.epochs": 2, "training.checkpoint_every": 1,
            "training.strategy": strategy, **recipe}
    full = train_cfg(tiny_cfg, run_id=f"{strategy}-full", **over)
    part = full.with_overrides({"run_id": f"{strategy}-resumed"})
    for cfg in (full, part):
        write_shards(cfg, seqs)
    two_gloo_ranks(full)
    two_gloo_ranks(part, stop_after=3)
    assert latest_checkpoint(open_store(part.storage, part.run_id))["step"] == 3
    two_gloo_ranks(part)
    a, b = (open_store(c.storage, c.run_id).get_json_verified(layout.metrics_key("train")) for c in (full, part))
    assert a["steps"] == b["steps"] == 4 and b["strategy"] == strategy
    for ha, hb in zip(a["history"], b["history"], strict=True):
        assert ha["tokens"] == hb["tokens"] and abs(ha["loss"] - hb["loss"]) < 1e-5
    pa, pb = _params(full), _params(part)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], atol=1e-6, rtol=1e-5, msg=k)


@pytest.mark.parametrize("recipe", [{}, RECIPE], ids=["decay-adamw", "dpace-muon"])
def test_preempt_after_relaunches_and_ends_with_the_bytes_of_an_uninterrupted_run(tiny_cfg, recipe):
    """training.preempt_after (the rehearsal's preemption): the train task's first launch stops after step 2
    without a final checkpoint, the second resumes from the step-2 checkpoint and ends with the weights and history
    of a run that was never interrupted, bit for bit: with D-PACE and Muon too (the momentum buffers, the AdamW
    moments of the rest and the schedule all restored)."""
    from flashdraft.components.train.launch import launch_training

    seqs = rule_sequences(48, seed=4)
    full = train_cfg(tiny_cfg, run_id="one-launch", **{"training.epochs": 2, "training.checkpoint_every": 1, **recipe})
    part = full.with_overrides({"run_id": "preempted", "training.preempt_after": 2})
    for cfg in (full, part):
        write_shards(cfg, seqs)
    a, b = launch_training(full), launch_training(part)
    assert a.resumed_from is None and b.resumed_from == 2 and a.steps == b.steps > 2
    assert b.peak_memory_bytes > 0  # CPU: the process's peak RSS
    assert [h["loss"] for h in a.history] == [h["loss"] for h in b.history]
    pa, pb = _params(full), _params(part)
    assert pa.keys() == pb.keys()
    assert [k for k in pa if not torch.equal(pa[k], pb[k])] == [], "tensors that differ after the resume"


def test_preempt_after_must_follow_a_checkpoint(tiny_cfg):
    with pytest.raises(ValueError, match="training.preempt_after=3 must be a multiple of training.checkpoint_every=2"):
        tiny_cfg.with_overrides({"training.checkpoint_every": 2, "training.preempt_after": 3})


def test_streaming_mode_follows_the_window_until_end_of_stream(tiny_cfg):
    from flashdraft.features.manifest import committed_parts
    from flashdraft.features.window import WindowProducer

    cfg = train_cfg(tiny_cfg, **{"mode.kind": "streaming", "mode.reuse": 2, "training.max_steps": 50})
    write_shards(cfg, rule_sequences(48, seed=3))
    store = open_store(cfg.storage, cfg.run_id)
    WindowProducer(store, cfg.mode).finish()  # the producer is done: the reader stops after the last part
    summary = run_train(cfg)
    assert summary.steps == 48 * 2 // 16  # every sample twice (reuse), 16 per row, then the stream ended
    assert committed_parts(store) == []  # fully used parts were released from the window


def test_streaming_interrupted_and_resumed_equals_uninterrupted(tiny_cfg):
    from flashdraft.features.manifest import committed_parts
    from flashdraft.features.window import WindowProducer

    seqs = rule_sequences(96, seed=4)
    over = {"mode.kind": "streaming", "mode.reuse": 2, "training.max_steps": 50, "training.checkpoint_every": 4}
    full = train_cfg(tiny_cfg, run_id="stream-full", **over)
    part = full.with_overrides({"run_id": "stream-resumed"})
    for cfg in (full, part):
        write_shards(cfg, seqs, parts=6)
        WindowProducer(open_store(cfg.storage, cfg.run_id), cfg.mode).finish()
    a = run_train(full)
    assert a.steps == 96 * 2 // 16

    store = open_store(part.storage, part.run_id)
    # 6 parts x 16 samples x 2 passes, 16 samples a step: a part spans 2 steps. Stop after step 7: the step-4
    # checkpoint covers parts 0-1 (released); part 2 was used up at step 6 but must stay for the resume from 4.
    assert run_train(part, stop_after=7).dump() == {"stopped_at": 7, "total_steps": 50}
    assert committed_parts(store) == [layout.feature_part_key(0, p) for p in range(2, 6)]
    b = run_train(part)
    assert [h["step"] for h in b.history] == list(range(1, a.steps + 1))
    for ha, hb in zip(a.history, b.history, strict=True):
        assert ha["tokens"] == hb["tokens"] and abs(ha["loss"] - hb["loss"]) < 1e-5  # the same samples, in order
    pa, pb = _params(full), _params(part)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], atol=1e-6, rtol=1e-5, msg=k)
    assert committed_parts(store) == []


@pytest.mark.slow
def test_streaming_two_ranks_interrupted_and_resumed_equals_uninterrupted(tiny_cfg):
    from flashdraft.features.manifest import committed_parts
    from flashdraft.features.window import WindowProducer

    seqs = rule_sequences(96, seed=5)
    over = {"mode.kind": "streaming", "mode.reuse": 2, "training.max_steps": 50, "training.checkpoint_every": 2,
            "training.nproc_per_node": 2}
    full = train_cfg(tiny_cfg, run_id="stream2-full", **over)
    part = full.with_overrides({"run_id": "stream2-resumed"})
    for cfg in (full, part):
        write_shards(cfg, seqs, parts=6)
        WindowProducer(open_store(cfg.storage, cfg.run_id), cfg.mode).finish()
    two_gloo_ranks(full)
    # Each rank takes 8 of a part's 16 samples, twice (reuse): 16 samples, exactly one step per part. Stop after
    # step 3: the step-2 checkpoint covers parts 0-1 (released); part 2, used up by step 3, waits for the resume.
    two_gloo_ranks(part, stop_after=3)
    store = open_store(part.storage, part.run_id)
    assert latest_checkpoint(store)["step"] == 2
    assert committed_parts(store) == [layout.feature_part_key(0, p) for p in range(2, 6)]
    two_gloo_ranks(part)
    a, b = (open_store(c.storage, c.run_id).get_json_verified(layout.metrics_key("train")) for c in (full, part))
    assert a["steps"] == b["steps"] == 6 and a["world_size"] == 2
    for ha, hb in zip(a["history"], b["history"], strict=True):
        assert ha["tokens"] == hb["tokens"] and abs(ha["loss"] - hb["loss"]) < 1e-5
    pa, pb = _params(full), _params(part)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], atol=1e-6, rtol=1e-5, msg=k)
    assert committed_parts(store) == []
