"""Export round trip: the z-lab folder reloads into DFlashDrafter with identical logits; config fields and weight
names are what vLLM/SGLang expect; speculators ids are z-lab ids + 1."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from support.shared_runs import copy_run

from flashdraft.components.export.export import read_export, run_export
from flashdraft.drafter.persistence import build_drafter, load_drafter
from flashdraft.storage.checkpoint import latest_checkpoint, save_checkpoint
from flashdraft.storage.store import ChecksumError, open_store
from flashdraft.target.model import load_hf_config


def _checkpointed_drafter(cfg):
    """A seeded drafter with perturbed norms, saved as the run's final checkpoint (no training needed)."""
    model = build_drafter(cfg, load_hf_config(cfg.target), seed=5)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    opt = torch.optim.AdamW(model.parameters())
    save_checkpoint(open_store(cfg.storage, cfg.run_id), model, opt, model.config_dict(),
                    {"step": 7, "history": []}, final=True)
    return model.eval()


def test_zlab_export_roundtrip_identical_logits(tiny_cfg, tmp_path):
    model = _checkpointed_drafter(tiny_cfg)
    cfg = tiny_cfg.with_overrides({"export.dtype": "float32", "export.formats": ["zlab", "speculators"]})
    summary = run_export(cfg, out_dir=tmp_path / "out")
    assert sorted(summary.formats) == ["speculators", "zlab"] and summary.dtype == "float32"
    folder = tmp_path / "out" / "zlab"
    assert summary.step == 7 and summary.final
    loaded = load_drafter(folder, target=tiny_cfg.target)
    feats = torch.randn(20, 5 * 256)
    g = model.geometry
    from flashdraft.drafter.attention import BlockLayout

    anchors = torch.tensor([4, 9, 12])
    ids = torch.randint(0, 1000, (20,))
    args = (feats, BlockLayout(20, g.block_size, anchors), torch.arange(20), ids[anchors], anchors)
    assert torch.equal(model.logits(model(*args)), loaded.logits(loaded(*args)))
    assert torch.equal(model.propose_block(feats, 3), loaded.propose_block(feats, 3))

    c = json.loads((folder / "config.json").read_text())
    assert c["architectures"] == ["DFlashDraftModel"] and c["model_type"] == "qwen3"
    assert c["block_size"] == g.block_size and c["num_target_layers"] == 8
    assert c["dflash_config"] == {"mask_token_id": g.mask_token_id, "target_layer_ids": [1, 2, 3, 4, 5],
                                  "block_size": g.block_size}
    assert c["num_hidden_layers"] == g.num_layers and c["layer_types"] == ["full_attention"] * g.num_layers
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight",
            "layers.0.mlp.gate_proj.weight"} <= names
    assert not any("embed" in n or "lm_head" in n or n == "mask_embedding" for n in names)
    # the tiny target has no free vocabulary row: the trainable mask embedding travels in its own file, and no
    # pickle unless asked (export.mask_embedding_pt, for vLLM)
    assert g.trainable_mask
    assert (folder / "mask_embedding.safetensors").is_file() and not (folder / "mask_embedding.pt").exists()
    assert "no mask_embedding.pt (a pickle, off by default)" in (folder / "README.md").read_text()
    # committed to the store too: the same files (a clean folder), committed by one manifest beside it
    store = open_store(tiny_cfg.storage, tiny_cfg.run_id)
    assert store.list("export/zlab/") == sorted(f"export/zlab/{f.name}" for f in folder.iterdir())
    assert read_export(store, "zlab") == {f.name: f.read_bytes() for f in folder.iterdir()}
    assert store.is_committed("export/zlab.manifest.json")

    s = json.loads((tmp_path / "out" / "speculators" / "config.json").read_text())
    assert s["aux_hidden_state_layer_ids"] == [2, 3, 4, 5, 6] and s["speculators_model_type"] == "dflash"
    assert s["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == g.block_size - 1
    with safe_open(str(tmp_path / "out" / "speculators" / "model.safetensors"), "pt") as f:
        assert {"embed_tokens.weight", "lm_head.weight", "fc.weight"} <= set(f.keys())


def test_bf16_export_and_cli(tiny_cfg, tmp_path):
    _checkpointed_drafter(tiny_cfg)
    cmd = [sys.executable, "-m", "flashdraft.cli.main", "export", "--preset", "tiny", "--set",
           f"storage.root={tiny_cfg.storage.root}", "--out", str(tmp_path / "cli")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with safe_open(str(tmp_path / "cli" / "zlab" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
    assert latest_checkpoint(open_store(tiny_cfg.storage, tiny_cfg.run_id))["step"] == 7


def test_export_without_checkpoint_fails_clearly(tiny_cfg, tmp_path):
    from flashdraft.components.export.export import ExportError

    with pytest.raises(ExportError, match="flashdraft train"):
        run_export(tiny_cfg, out_dir=tmp_path)


def test_export_without_local_folder_writes_only_the_store(tiny_cfg, tmp_path, monkeypatch):
    _checkpointed_drafter(tiny_cfg)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    summary = run_export(tiny_cfg)
    assert summary.formats["zlab"].local is None and list(cwd.iterdir()) == []
    assert "model.safetensors" in read_export(open_store(tiny_cfg.storage, tiny_cfg.run_id), "zlab")


def test_draft_vocab_exports_as_vllm_reads_it_and_roundtrips(tiny_cfg, tmp_path):
    """A reduced draft vocabulary: z-lab weights carry d2t offsets (target id = index + d2t) and the drafter's own
    [K, H] lm_head; reloaded, the drafter scores only those ids (-inf elsewhere) with identical logits."""
    cfg = tiny_cfg.with_overrides({"drafter.draft_vocab_size": 64})
    model = build_drafter(cfg, load_hf_config(cfg.target), seed=5)
    ids = torch.randperm(model.geometry.vocab_size, generator=torch.Generator().manual_seed(0))[:64]
    model.set_draft_vocab(ids)
    save_checkpoint(open_store(cfg.storage, cfg.run_id), model, torch.optim.AdamW(model.parameters()),
                    model.config_dict(), {"step": 3, "history": []}, final=True)
    run_export(cfg.with_overrides({"export.dtype": "float32"}), out_dir=tmp_path / "out")
    folder = tmp_path / "out" / "zlab"
    assert json.loads((folder / "config.json").read_text())["draft_vocab_size"] == 64
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        d2t, head = f.get_tensor("d2t"), f.get_tensor("lm_head.weight")
    assert d2t.dtype == torch.int64 and torch.equal(d2t + torch.arange(64), ids.sort().values)
    assert torch.equal(head, model.lm_head_weight[ids.sort().values])
    loaded = load_drafter(folder, target=cfg.target)
    feats = torch.randn(12, 5 * 256)
    a, b = model.eval().draft_logits(feats, 3), loaded.draft_logits(feats, 3)
    assert torch.equal(a, b)
    outside = torch.ones(model.geometry.vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert torch.isinf(a[:, outside]).all() and torch.isfinite(a[:, ~outside]).all()


def test_a_byte_flipped_at_rest_in_the_checkpoint_stops_evaluate_and_export(tiny_evaluated, tmp_path):
    """The committed checkpoint's weights are read verified: one byte flipped at rest (the file still parses as
    safetensors, so a plain read loads another drafter) makes evaluate and export refuse, naming the key, and
    nothing is exported."""
    from flashdraft.components.evaluate.evaluate import run_evaluate

    cfg, _ = copy_run(tiny_evaluated, tmp_path)
    store = open_store(cfg.storage, cfg.run_id)
    key = f"{latest_checkpoint(store)['prefix']}/model.safetensors"
    path = Path(cfg.storage.root.removeprefix("file://")) / cfg.run_id / key
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # inside the last tensor's values
    path.write_bytes(bytes(data))
    for stage in (run_evaluate, lambda c: run_export(c, out_dir=tmp_path / "out")):
        with pytest.raises(ChecksumError, match=rf"checksum mismatch for \S*/{re.escape(key)}: .*corrupt"):
            stage(cfg)
    assert not store.list("export/") and not (tmp_path / "out").exists()


def test_the_pickle_vllm_reads_a_trained_mask_from_is_written_only_when_asked(tiny_cfg, tmp_path):
    """By default an export folder holds no pickle, and vllm_spec refuses the folder (vLLM would draft with the
    placeholder row); with export.mask_embedding_pt the z-lab folder adds mask_embedding.pt (the trained mask,
    equal to the safetensors copy) and the card says why; the speculators folder never holds one."""
    from safetensors.torch import load_file

    from flashdraft.components.evaluate.vllm_spec import missing_mask_override

    _checkpointed_drafter(tiny_cfg)
    run_export(tiny_cfg.with_overrides({"export.formats": ["zlab", "speculators"]}), out_dir=tmp_path / "plain")
    assert not list((tmp_path / "plain").rglob("*.pt"))
    assert "re-export with export.mask_embedding_pt=true" in missing_mask_override(str(tmp_path / "plain" / "zlab"))
    cfg = tiny_cfg.with_overrides({"export.mask_embedding_pt": True, "export.formats": ["zlab", "speculators"]})
    run_export(cfg, out_dir=tmp_path / "out")
    folder = tmp_path / "out" / "zlab"
    mask = torch.load(folder / "mask_embedding.pt", weights_only=True)
    assert torch.equal(mask, load_file(str(folder / "mask_embedding.safetensors"))["mask_embedding"])
    assert "vLLM's DFlash loader reads a trained mask only from that file" in (folder / "README.md").read_text()
    assert missing_mask_override(str(folder)) is None
    assert not list((tmp_path / "out" / "speculators").glob("*.pt"))
