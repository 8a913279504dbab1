"""Extraction on the tiny target: committed shards, features == HF hidden_states[id+1], kill/rerun identical."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from support.feature_fixtures import write_responses

from flashdraft.components.extract.extract import FAULT_ENV, length_buckets, run_extract
from flashdraft.features.manifest import committed_parts
from flashdraft.features.shard import iter_shard
from flashdraft.storage import layout
from flashdraft.storage.store import open_store
from flashdraft.target.model import load_causal_lm


@pytest.fixture()
def cfg(tiny_cfg):
    return tiny_cfg.with_overrides({"features.shard_bytes": 40_000, "features.batch_tokens": 64})


def _parts(cfg):
    store = open_store(cfg.storage, cfg.run_id)
    return {k: store.get_verified(k) for k in committed_parts(store)}


def test_extract_writes_committed_shards_matching_hf(cfg):
    rows = write_responses(cfg)
    summary = run_extract(cfg, 0)
    store = open_store(cfg.storage, cfg.run_id)
    parts = _parts(cfg)
    assert len(parts) >= 2 and summary.samples == len(rows) and store.is_committed(layout.features_done_key(0))
    assert store.get_json_verified(layout.FEATURES_MANIFEST)["totals"]["samples"] == len(rows)
    samples = [s for k in sorted(parts) for s in iter_shard(parts[k], k)]
    assert [s.sample_id for s in samples] == [r["sample_id"] for r in rows]
    model = load_causal_lm(cfg.target)
    ids = cfg.layer_ids()
    for s, r in zip(samples, rows, strict=True):  # every sample: each sat in some padded, length-sorted forward
        assert s.input_ids.tolist() == r["input_ids"] and s.loss_mask.tolist() == [bool(m) for m in r["loss_mask"]]
        with torch.inference_mode():
            hs = model(input_ids=torch.tensor([r["input_ids"]]), output_hidden_states=True).hidden_states
        ref = torch.cat([hs[i + 1][0] for i in ids], dim=-1).to(torch.bfloat16)
        # right-padded batch vs a lone forward: equal up to float reassociation and the bf16 rounding
        torch.testing.assert_close(s.features.float(), ref.float(), rtol=2e-2, atol=2e-2)
    from flashdraft.run.runner import run_task

    first = run_task(cfg, "extract", 0)  # through the runner: a complete shard's run writes nothing new
    assert first.new_tokens == 0 and run_task(cfg, "extract", 0).skipped is True  # then the result is reused


def test_length_buckets_sort_and_bound_the_padded_size():
    lengths = [5, 30, 7, 7, 12, 3, 40, 9]
    groups = length_buckets(lengths, 24)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))  # every sample exactly once
    flat = [lengths[i] for g in groups for i in g]
    assert flat == sorted(lengths) and [i for g in groups for i in g][2:4] == [2, 3]  # ties keep input order
    for g in groups:
        assert len(g) * lengths[g[-1]] <= 24 or len(g) == 1  # padded size bounded; longer samples alone
    assert [len(g) for g in groups] == [3, 2, 1, 1, 1]  # [3, 5, 7], [7, 9], [12], [30], [40]
    assert length_buckets(lengths, 24) == groups


@pytest.mark.parametrize("codec", ["bf16-zstd", "q4"])
def test_kill_mid_shard_then_rerun_commits_identical_bytes(cfg, tmp_path, codec):
    cfg = cfg.with_overrides({"features.codec": codec})
    write_responses(cfg)
    reference = cfg.with_overrides({"run_id": "reference"})
    write_responses(reference)
    run_extract(reference, 0)
    expected = {k: v for k, v in _parts(reference).items()}

    env = {**os.environ, FAULT_ENV: "1"}
    code = ("import json, sys; from flashdraft.config import load_config; "
            "from flashdraft.components.extract.extract import run_extract; "
            "run_extract(load_config(preset='tiny', overrides=json.loads(sys.argv[1])), 0)")
    overrides = {"storage.root": cfg.storage.root, "features.shard_bytes": 40_000, "features.batch_tokens": 64,
                 "features.codec": codec}
    cmd = [sys.executable, "-c", code, json.dumps(overrides)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 137, proc.stderr[-2000:]
    store = open_store(cfg.storage, cfg.run_id)
    orphan = layout.feature_part_key(0, 1)
    assert store.exists(orphan) and not store.is_committed(orphan)     # the orphan...
    assert committed_parts(store) == [layout.feature_part_key(0, 0)]  # ...is invisible

    summary = run_extract(cfg, 0)
    assert summary.resumed_from_sample > 0
    assert _parts(cfg) == expected


@pytest.mark.parametrize("codec", ["bf16-zstd", "q4"])
def test_features_verify_passes_then_flags_a_corrupted_shard(cfg, codec):
    import typer
    from typer.testing import CliRunner

    from flashdraft.components.extract import cli

    cfg = cfg.with_overrides({"features.codec": codec})
    write_responses(cfg, n=6)
    run_extract(cfg, 0)
    app = typer.Typer()
    cli.register_features(app)
    args = ["features", "verify", "--preset", "tiny", "--set", f"storage.root={cfg.storage.root}", "--set",
            f"features.codec={codec}", "-n", "3"]
    ok = CliRunner().invoke(app, args)
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.output[ok.output.index("{"):])
    # the codec's own tolerance (registry): lossless ~0, q4 its quantisation error, nonzero
    assert report["tolerance"] == (0.01 if codec == "bf16-zstd" else 0.2)
    assert (report["max_rel_rms_error"] > 0.01) == (codec == "q4")

    store = open_store(cfg.storage, cfg.run_id)
    key = committed_parts(store)[0]
    data = bytearray(store.get(key))
    data[-10] ^= 0x40
    store.put(key, bytes(data))  # bit rot after commit
    bad = CliRunner().invoke(app, args + ["-n", "6"])
    assert bad.exit_code == 1
    assert "checksum mismatch" in bad.output


def test_extract_on_real_smollm2_matches_hf(tmp_path):
    from flashdraft.config import load_config

    cfg = load_config(preset="smollm2-local", overrides={"storage.root": f"file://{tmp_path}/runs",
                                                         "features.codec": "fp8-zstd"})
    rows = write_responses(cfg, n=3)
    assert run_extract(cfg, 0).samples == 3
    store = open_store(cfg.storage, cfg.run_id)
    samples = [s for k in committed_parts(store) for s in iter_shard(store.get_verified(k), k)]
    model = load_causal_lm(cfg.target)
    with torch.inference_mode():
        hs = model(input_ids=torch.tensor([rows[0]["input_ids"]]), output_hidden_states=True).hidden_states
    t = len(rows[0]["input_ids"])
    got = samples[0].features.float().reshape(t, 5, -1)
    for k, i in enumerate(cfg.layer_ids()):
        ref = hs[i + 1][0]
        assert float((got[:, k] - ref).norm() / ref.norm()) < 0.05  # fp8: a few % relative error


def test_parts_respect_shard_bytes_with_a_large_batch_and_resume_mid_batch(cfg):
    """A part closes at the first sample that takes it to features.shard_bytes, not at the end of a batch of
    features.batch_tokens (the README's streaming window relies on it); a kill between parts of one batch then
    resumes inside that batch and still commits identical bytes."""
    big = cfg.with_overrides({"features.batch_tokens": 4096})  # the whole shard in one batch
    write_responses(big)
    reference = big.with_overrides({"run_id": "reference"})
    write_responses(reference)
    run_extract(reference, 0)
    expected = _parts(reference)
    sizes = [len(expected[k]) for k in sorted(expected)]
    assert len(sizes) >= 3, sizes
    biggest_sample = max(len(s.input_ids) for k in expected for s in iter_shard(expected[k], k)) * 5 * 256 * 2
    assert all(40_000 <= n < 40_000 + biggest_sample + 4096 for n in sizes[:-1]), sizes

    code = ("import json, sys; from flashdraft.config import load_config; "
            "from flashdraft.components.extract.extract import run_extract; "
            "run_extract(load_config(preset='tiny', overrides=json.loads(sys.argv[1])), 0)")
    overrides = {"storage.root": big.storage.root, "features.shard_bytes": 40_000, "features.batch_tokens": 4096}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(overrides)], env={**os.environ, FAULT_ENV: "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 137, proc.stderr[-2000:]
    assert run_extract(big, 0).resumed_from_sample > 0
    assert _parts(big) == expected


def test_streaming_draft_vocabulary_counts_the_replies_exactly_as_offline_counts_the_features(cfg):
    """mode.kind=streaming with drafter.draft_vocab_size: the vocabulary is counted from the generated replies
    (split over ranks) before any feature part streams in, and equals the count an offline run makes over the
    extracted features."""
    from flashdraft.components.train.schedule import TrainError, response_samples
    from flashdraft.drafter.vocab import count_response_tokens
    from flashdraft.features.reader import open_reader

    write_responses(cfg, n=9)
    store = open_store(cfg.storage, cfg.run_id)
    with pytest.raises(TrainError, match=r"generation shard\(s\) \[0\] are not done"):
        next(response_samples(store, 1, 0, 1))
    store.commit_json(layout.responses_done_key(0), {"samples": 9})
    run_extract(cfg, 0)
    vocab = 49152
    offline = count_response_tokens((vars(s) for s in open_reader(cfg.with_overrides({"data.num_shards": 1}))), vocab)
    per_rank = [count_response_tokens((vars(s) for s in response_samples(store, 1, r, 2)), vocab) for r in (0, 1)]
    assert int(offline.sum()) > 0 and torch.equal(per_rank[0] + per_rank[1], offline)
    assert 0 < int(per_rank[0].sum()) < int(offline.sum()), "each rank counts its own share"
