"""Sliding-window draft layers and a drafter head layout of its own: the model honours the window (cache and
packing included), the config refuses what cannot run, and the z-lab export states the same windows vLLM reads."""

from __future__ import annotations

import json

import pytest
import torch

from flashdraft.config import ConfigError, load_config
from flashdraft.drafter.attention import BlockLayout
from flashdraft.drafter.dflash_drafter import DFlashDrafter
from flashdraft.drafter.geometry import DrafterGeometry, geometry_from_hf
from flashdraft.drafter.persistence import build_drafter, drafter_from_parts
from flashdraft.target.model import load_hf_config

H, V, B, NF = 64, 97, 4, 3


def drafter(layer_types=None, window=None, seed=1) -> DFlashDrafter:
    g = DrafterGeometry(hidden_size=H, num_heads=8, num_kv_heads=2, head_dim=8, intermediate_size=96,
                        rope_theta=10000.0, rms_norm_eps=1e-6, vocab_size=V, num_layers=2, block_size=B,
                        target_layer_ids=[1, 2, 3], num_target_layers=6, mask_token_id=V - 1,
                        layer_types=layer_types, sliding_window=window)
    gen = torch.Generator().manual_seed(0)
    m = DFlashDrafter(g, attn_impl="sdpa")
    m.set_frozen(torch.randn(V, H, generator=gen), torch.randn(V, H, generator=gen))
    m.init_weights(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.ndim == 2:
                p.mul_(5)
    return m.eval()


SLIDING = ["sliding_attention", "full_attention"]


def test_window_limits_what_a_block_sees():
    torch.manual_seed(0)
    m = drafter(SLIDING, 6)
    S = 30
    feats = torch.randn(S, NF * H)
    base = m.draft_logits(feats, 3)
    # every layer sliding: context older than the window cannot matter
    m_all = drafter(["sliding_attention"] * 2, 6)
    far = feats.clone()
    far[: S - 6] += 3.0
    assert torch.equal(m_all.draft_logits(far, 3), m_all.draft_logits(feats, 3))
    near = feats.clone()
    near[S - 1] += 3.0
    assert not torch.allclose(m_all.draft_logits(near, 3), m_all.draft_logits(feats, 3), atol=1e-4)
    # one full layer reintroduces the old context; a window past the context equals full attention
    assert not torch.allclose(m.draft_logits(far, 3), base, atol=1e-4)
    torch.testing.assert_close(drafter(SLIDING, S + B).draft_logits(feats, 3), drafter().draft_logits(feats, 3))


def test_context_cache_matches_recompute_with_window():
    torch.manual_seed(1)
    m = drafter(SLIDING, 5)
    feats, session = torch.randn(17, NF * H), m.new_session(cached=True)
    session.extend(feats[:9])
    session.extend(feats[9:])
    torch.testing.assert_close(session.logits(4), m.draft_logits(feats, 4), atol=1e-5, rtol=1e-5)


def test_packed_training_forward_equals_each_document_alone_with_window():
    torch.manual_seed(2)
    m = drafter(SLIDING, 5)
    feats, ids = torch.randn(26, NF * H), torch.randint(0, V - 1, (26,))
    doc = torch.tensor([0] * 10 + [1] * 16)
    pos = torch.cat([torch.arange(10), torch.arange(16)])
    anchors = torch.tensor([7, 18, 22])
    packed = m(feats, BlockLayout(26, B, anchors, doc, doc[anchors]), pos, ids[anchors], pos[anchors])
    alone = m(feats[10:], BlockLayout(16, B, anchors[1:] - 10), pos[10:], ids[anchors[1:]], pos[anchors[1:]])
    torch.testing.assert_close(packed[1:], alone, atol=1e-5, rtol=1e-5)
    # the training view of an anchor equals the inference API at that point
    torch.testing.assert_close(m.logits(alone[1, 1:]), m.draft_logits(feats[10:22], int(ids[22])),
                               atol=1e-4, rtol=1e-4)


def test_geometry_validation():
    with pytest.raises(ValueError, match="sliding_window"):
        drafter(["sliding_attention", "full_attention"], None)
    with pytest.raises(ValueError, match="need 2 entries"):
        drafter(["full_attention"], None)


def test_drafter_config_fields_and_errors(tiny_cfg):
    hf = load_hf_config(tiny_cfg.target)
    over = {"drafter.num_heads": 8, "drafter.num_kv_heads": 2, "drafter.head_dim": 32,
            "drafter.intermediate_size": 320, "drafter.sliding_window": 16}
    cfg = load_config(preset="tiny", overrides={**over, "storage.root": tiny_cfg.storage.root})
    m = build_drafter(cfg, hf, seed=0)
    g = m.geometry
    assert (g.hidden_size, g.num_heads, g.num_kv_heads, g.head_dim, g.intermediate_size) == (256, 8, 2, 32, 320)
    assert g.layer_types == ["sliding_attention"] and g.sliding_window == 16
    assert m.layers[0].self_attn.q_proj.weight.shape == (8 * 32, 256) and m.layers[0].self_attn.window == 16
    assert m.layers[0].mlp.up_proj.weight.shape == (320, 256)
    # default: the target's layout, full attention
    d = build_drafter(tiny_cfg, hf, seed=0).geometry
    assert (d.num_heads, d.num_kv_heads, d.head_dim, d.layer_types) == (4, 2, 64, ["full_attention"])
    with pytest.raises(ConfigError, match="drafter.hidden_size 512 != target hidden size 256"):
        geometry_from_hf(hf, num_layers=1, block_size=8, target_layer_ids=[1], mask_token_id=0,
                         trainable_mask=False, hidden_size=512)
    with pytest.raises(ConfigError, match="drafter.layer_types"):
        load_config(preset="tiny", overrides={"drafter.layer_types": ["sliding_attention"]})
    with pytest.raises(ConfigError, match="num_kv_heads=3"):
        load_config(preset="tiny", overrides={"drafter.num_heads": 8, "drafter.num_kv_heads": 3})


def test_zlab_export_states_the_windows_and_reads_them_back(tmp_path, tiny_cfg):
    from flashdraft.components.export.export import _files_zlab
    from flashdraft.drafter.zlab import read_zlab

    hf = load_hf_config(tiny_cfg.target)
    cfg = load_config(preset="tiny", overrides={"drafter.num_layers": 2, "drafter.num_heads": 8,
                                                "drafter.head_dim": 16, "drafter.sliding_window": 12,
                                                "drafter.layer_types": ["sliding_attention", "full_attention"],
                                                "storage.root": tiny_cfg.storage.root})
    m = build_drafter(cfg, hf, seed=4).eval()
    folder = tmp_path / "zlab"
    folder.mkdir()
    for name, data in _files_zlab(m, "float32").items():
        (folder / name).write_bytes(data)
    c = json.loads((folder / "config.json").read_text())
    assert c["layer_types"] == ["sliding_attention", "full_attention"] and c["sliding_window"] == 12
    assert c["use_sliding_window"] is True and c["is_causal"] is False
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (8, 2, 16)
    geometry, weights = read_zlab(folder)
    assert DrafterGeometry(**geometry) == m.geometry
    loaded = drafter_from_parts(geometry, weights, target=cfg.target)
    feats = torch.randn(40, 5 * 256)
    assert torch.equal(loaded.draft_logits(feats, 3), m.draft_logits(feats, 3))
    # vLLM runs a sliding_attention layer causally unless is_causal says otherwise: such a folder is refused
    del c["is_causal"]
    (folder / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match="causal DFlash layers"):
        read_zlab(folder)


def test_production_preset_drafter_is_the_published_geometry():
    """qwen3.6-27b's drafter section on a config of the real target's text model (no weights) gives the published
    drafter's layer geometry (SpecForge configs/qwen3.6-27b-dflash2.json) in the exported config.json."""
    from transformers import Qwen3_5Config

    from flashdraft.drafter.zlab import zlab_config

    cfg = load_config(preset="qwen3.6-27b")
    target = Qwen3_5Config(text_config={"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 24,
                                        "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408,
                                        "vocab_size": 248320, "rope_parameters": {"rope_theta": 1e7,
                                                                                  "partial_rotary_factor": 0.25,
                                                                                  "rope_type": "default"}})
    g = geometry_from_hf(target, num_layers=cfg.drafter.num_layers, block_size=cfg.drafter.block_size,
                         target_layer_ids=cfg.layer_ids(64), mask_token_id=248070, trainable_mask=False,
                         **cfg.drafter.geometry_overrides())
    c = zlab_config(g.__dict__, "bfloat16")
    published = {"hidden_size": 5120, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "intermediate_size": 17408, "num_hidden_layers": 5, "sliding_window": 2048,
                 "use_sliding_window": True, "is_causal": False, "layer_types": ["sliding_attention"] * 5,
                 "rope_theta": 1e7, "vocab_size": 248320}
    assert {k: c[k] for k in published} == published
