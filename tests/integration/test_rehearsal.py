"""The qwen3.6-27b-rehearsal's production-shape paths at CI size: the real 248,320 x 5,120 frozen embedding and
LM head of a random Qwen3.6-27B target (one layer deep), the real Qwen3.6 tokenizer's mask row, the production
drafter's attention geometry (32 x 128 heads, 8 KV heads, window 2048, block 16, 512 anchors a sample), fp8-zstd
shards, FSDP2 over 2 gloo ranks with a checkpoint a step, preempted after step 1 and resumed, then a full-width
z-lab export that the vLLM reader's checks accept. Cut for CI: one feature layer, MLP 1024
wide, two short samples with 2 anchors each (every drafted slot costs ~5 GFLOP through the 248k head, forward and
gradient), random features (docs/rehearsal.md)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load as load_bytes
from support.gloo_ranks import two_gloo_ranks

from flashdraft.components.export.export import run_export
from flashdraft.config import load_config
from flashdraft.features.manifest import codec_from_config, make_provenance, part_stats
from flashdraft.features.shard import build_shard, encode_sample
from flashdraft.storage import layout
from flashdraft.storage.checkpoint import latest_checkpoint
from flashdraft.storage.store import open_store
from flashdraft.target.model import load_tokenizer, tokenizer_fingerprint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
SAMPLE_LEN, RESPONSE = 48, 18  # anchors need a < T - B in the response: 2 a sample


def rehearsal_cfg(tmp_path, **over):
    return load_config(preset="qwen3.6-27b-rehearsal", overrides={
        "storage.root": f"file://{tmp_path}/runs", "target.num_layers": 1, "features.num_features": 1,
        "features.layer_ids": [0], "drafter.intermediate_size": 1024, "training.epochs": 2, **over})


def write_random_shards(cfg, n: int = 2) -> None:
    """`n` samples of SAMPLE_LEN real-vocabulary tokens with random bf16 features, one shard per sample."""
    ids = cfg.layer_ids()
    tok = load_tokenizer(cfg.target)
    prov = make_provenance(cfg, tokenizer_fingerprint(tok), 5120, ids)
    codec = codec_from_config(cfg)
    store = open_store(cfg.storage, cfg.run_id)
    g = torch.Generator().manual_seed(0)
    done: dict[int, list[dict]] = {shard: [] for shard in range(cfg.data.num_shards)}
    for i in range(n):
        tokens = torch.randint(0, 248044, (SAMPLE_LEN,), generator=g).tolist()
        mask = [0] * (SAMPLE_LEN - RESPONSE) + [1] * RESPONSE
        feats = torch.randn(SAMPLE_LEN, len(ids), 5120, generator=g).bfloat16()
        row = (f"s{i}", SAMPLE_LEN, encode_sample(codec, tokens, mask, feats))
        shard, key = i % cfg.data.num_shards, layout.feature_part_key(i % cfg.data.num_shards, i // cfg.data.num_shards)
        record = store.commit(key, build_shard(codec, ids, 5120, prov, [row]),
                              {"samples": 1, "tokens": SAMPLE_LEN, "provenance": prov})
        done[shard].append({"key": key, **part_stats(record)})
    for shard, parts in done.items():  # extract's DONE records: what offline training reads its part list from
        store.commit_json(layout.features_done_key(shard), {"shard": shard, "parts": parts})


def test_full_width_fsdp2_checkpoints_and_export(tmp_path):
    from flashdraft.drafter.zlab import read_zlab

    cfg = rehearsal_cfg(tmp_path)
    write_random_shards(cfg)
    # one sample a rank, one row a step, 2 epochs: 2 steps, a checkpoint after each; preempted after step 1 and
    # relaunched (the resume scatters the full fp32 state dicts to the FSDP2 shards)
    peaks = two_gloo_ranks(cfg, stop_after=1)
    store = open_store(cfg.storage, cfg.run_id)
    assert latest_checkpoint(store) == {"step": 1, "prefix": layout.checkpoint_prefix(1), "final": False}
    peaks += two_gloo_ranks(cfg)
    assert latest_checkpoint(store) == {"step": 2, "prefix": layout.checkpoint_prefix(2), "final": True}
    summary = store.get_json_verified(layout.metrics_key("train"))
    assert summary["steps"] == 2 and summary["world_size"] == 2 and summary["strategy"] == "fsdp2"
    assert [h["step"] for h in summary["history"]] == [1, 2]
    for h in summary["history"]:  # 2 anchors a sample (18 response tokens, block 16), both ranks counted
        assert h["anchors"] == 2 * (RESPONSE - cfg.drafter.block_size) and h["loss"] == h["loss"]
    # the frozen 248k x 5120 embedding and head are mapped, not copied: before, each rank read both and upcast
    # them to fp32 (10.2 GB a rank). Measured: 6.45 GB (rank 0, with the checkpoint gathers) and 4.78 GB peak RSS,
    # file-backed head pages included
    assert max(peaks) < 8e9, peaks
    weights = load_bytes(store.get_verified(f"{layout.checkpoint_prefix(2)}/model.safetensors"))
    opt = load_bytes(store.get_verified(f"{layout.checkpoint_prefix(2)}/optimizer.safetensors"))
    assert weights["layers.0.self_attn.q_proj.weight"].shape == (32 * 128, 5120)
    assert weights["fc.weight"].shape == (5120, 5120) and "mask_embedding" not in weights
    assert int(opt["fc.weight/step"]) == 2 and float(opt["fc.weight/exp_avg_sq"].abs().sum()) > 0

    export = run_export(cfg, out_dir=tmp_path / "export")
    folder = tmp_path / "export" / "zlab"
    c = json.loads((folder / "config.json").read_text())
    # the real tokenizer has no mask token: the first row past its 248,077 ids
    assert export.mask_token_id == 248077 and not export.trainable_mask
    assert load_tokenizer(cfg.target).convert_tokens_to_ids("<|endoftext|>") == 248044
    assert c["dflash_config"] == {"mask_token_id": 248077, "target_layer_ids": [0], "block_size": 16}
    assert (c["vocab_size"], c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
            c["head_dim"]) == (248320, 5120, 32, 8, 128)
    assert c["layer_types"] == ["sliding_attention"] and c["sliding_window"] == 2048 and c["is_causal"] is False
    geometry, exported = read_zlab(folder)  # the vLLM reader's checks (zlab.py)
    assert exported["layers.0.mlp.down_proj.weight"].shape == (5120, 1024)
    assert geometry["mask_token_id"] == 248077
