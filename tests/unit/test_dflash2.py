"""DFlash2's parts (flashdraft/drafter/dflash2.py): identity at init, causal in-block convolution, the selector walk,
the selector objectives, the extra-parameter count and the dflash2 save/load round trip."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from flashdraft.drafter.attention import BlockLayout
from flashdraft.drafter.dflash2 import (
    BlockConv,
    CandidateSelector,
    dflash2_extra_params,
    select_walk,
    selector_loss,
    selector_scale,
)
from flashdraft.drafter.dflash_drafter import DFlashDrafter
from flashdraft.drafter.geometry import DrafterGeometry

H, V, B, NF, K = 64, 97, 4, 3, 5


def geometry(kind: str = "dflash2") -> DrafterGeometry:
    g = DrafterGeometry(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                        rope_theta=10000.0, rms_norm_eps=1e-6, vocab_size=V, num_layers=2, block_size=B,
                        target_layer_ids=[1, 2, 3], num_target_layers=6, mask_token_id=V - 1)
    if kind == "dflash2":
        g = replace(g, kind="dflash2", conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=K)
    return g


def drafter(kind: str = "dflash2", seed: int = 1) -> DFlashDrafter:
    gen = torch.Generator().manual_seed(0)
    m = DFlashDrafter(geometry(kind), attn_impl="sdpa")
    m.set_frozen(torch.randn(V, H, generator=gen), torch.randn(V, H, generator=gen))
    m.init_weights(seed)
    return m.eval()


def inputs(S: int = 20):
    gen = torch.Generator().manual_seed(2)
    feats, ids = torch.randn(S, NF * H, generator=gen), torch.randint(0, V - 1, (S,), generator=gen)
    anchors = torch.tensor([3, 9, 14])
    return feats, BlockLayout(S, B, anchors), torch.arange(S), ids[anchors], anchors


def test_untrained_dflash2_equals_dflash_of_the_same_seed():
    d1, d2 = drafter("dflash"), drafter("dflash2")
    args = inputs()
    torch.testing.assert_close(d2(*args), d1(*args), rtol=0, atol=0)
    feats = args[0]
    assert torch.equal(d2.propose_block(feats, 5), d1.propose_block(feats, 5)), "an untrained selector walks argmax"


def test_convolution_is_causal_within_each_block_and_dynamic():
    torch.manual_seed(0)
    conv = BlockConv(H, 3, 16)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x = torch.randn(2 * B, H)  # two blocks
    y, delta = conv.prepare(x, B)
    x2 = x.clone()
    x2[B + 2] += 1.0  # block 2, position 2
    y2, delta2 = conv.prepare(x2, B)
    changed = (y2 - y).abs().sum(-1) > 1e-6
    # position 2 (its own delta and tap 0), 3 (tap 1) of block 2 only; never block 1 or earlier positions
    assert changed.tolist() == [False] * B + [False, False, True, True]
    # the taps: rebuild position p from the definition (base + per-token group delta) * x[p - t]
    p = 3
    expected = torch.zeros(H)
    d = delta[p].view(3, H // 16)  # side-1 deltas of row p; side 0 checked through y below
    for t in range(3):
        coef = conv.base_kernel[1, t] + d[t].repeat_interleave(16)
        expected += coef * x[p - t]
    torch.testing.assert_close(conv.finish(x, delta, B)[p], expected)
    side0 = conv.kernel_projection(x).view(2 * B, 2, 3, H // 16)[:, 0]
    expected0 = sum((conv.base_kernel[0, t] + side0[p, t].repeat_interleave(16)) * x[p - t] for t in range(3))
    torch.testing.assert_close(y[p], expected0)


def test_walk_follows_the_previous_choice():
    ids = torch.tensor([[10, 11], [20, 21], [30, 31]])
    scores = torch.zeros(3, 2, 2)
    scores[0, 0] = torch.tensor([0.0, 1.0])      # slot 0 (after the anchor): candidate 1 -> 11
    scores[1, 1] = torch.tensor([2.0, 0.0])      # after 11: candidate 0 -> 20
    scores[1, 0] = torch.tensor([0.0, 5.0])      # (what the walk would read after 10: not taken)
    scores[2, 0] = torch.tensor([0.0, 1.0])      # after 20: 31
    assert select_walk(ids, scores).tolist() == [11, 20, 31]


def test_trained_selector_changes_the_walk_and_the_scores_use_the_predecessor():
    m = drafter()
    sel = m.candidate_selector
    with torch.no_grad():
        sel.hidden_projection.weight.normal_(0, 3.0)
        sel.predecessor_codebook.normal_(0, 3.0)
        sel.successor_codebook.normal_(0, 3.0)
    feats = inputs()[0]
    hidden = m.draft_hidden(feats, 5)
    ids, scores = m.candidates(hidden, 5)
    assert ids.shape == (B - 1, K) and scores.shape == (B - 1, K, K)
    assert torch.equal(ids, m.logits(hidden).topk(K).indices)
    assert torch.allclose(scores[0, 0], scores[0, 1]), "slot 0's predecessor is the anchor for every row"
    assert not torch.allclose(scores[1, 0], scores[1, 1]), "later slots depend on the previous choice"
    assert torch.equal(m.propose_block(feats, 5), select_walk(ids, scores))
    # the session (cached context) drafts the same
    session = m.new_session()
    session.extend(feats)
    assert torch.equal(session.propose(5), m.propose_block(feats, 5))


@pytest.mark.parametrize("objective", ["gold_topk", "strict_topk"])
def test_selector_objectives(objective):
    torch.manual_seed(0)
    sel = CandidateSelector(H, V, 8, K)
    with torch.no_grad():
        sel.predecessor_codebook.normal_()
        sel.successor_codebook.normal_()
        sel.hidden_projection.weight.normal_()
    head = torch.randn(V, H)
    hidden = torch.randn(6, H, requires_grad=True)
    cands = (hidden @ head.T).topk(K).indices
    gold = cands[:, 2].clone()
    for row in (1, 4):  # two rows miss the top-k
        gold[row] = next(t for t in range(V) if t not in cands[row].tolist())
    previous = torch.randint(0, V, (6,))
    out = selector_loss(sel, hidden, head, cands, gold, previous, torch.ones(6), objective)
    assert int(out.coverage) == 4
    assert int(out.rows) == (6 if objective == "gold_topk" else 4)
    out.loss.backward()
    assert sel.hidden_projection.weight.grad.abs().sum() > 0 and hidden.grad.abs().sum() > 0
    hidden.grad = None
    detached = selector_loss(sel, hidden, head, cands, gold, previous, torch.ones(6), objective, detach=True)
    detached.loss.backward()
    assert hidden.grad is None, "selector_detach keeps the selector loss out of the drafter"
    # a row's loss is the CE of the gold index among its (possibly gold-patched) candidates
    row = 0
    h = hidden[row].detach()
    scores = head[cands[row]] @ h + sel(previous[row:row + 1], cands[row], h)[0]
    single = selector_loss(sel, hidden[row:row + 1].detach(), head, cands[row:row + 1], gold[row:row + 1],
                           previous[row:row + 1], torch.ones(1), objective)
    torch.testing.assert_close(single.loss, torch.nn.functional.cross_entropy(scores[None], torch.tensor([2])))


def test_selector_scale_warms_up_then_ramps():
    assert [selector_scale(s, 100, 2.0, 0.1, 0.2) for s in (0, 9, 10, 19, 29, 50)] == [0.0, 0.0, 0.1, 1.0, 2.0, 2.0]
    assert selector_scale(0, 100, 1.0, 0.0, 0.0) == 1.0


def test_extra_parameter_count_matches_the_modules():
    m = drafter()
    base = sum(p.numel() for p in drafter("dflash").parameters())
    extra = dflash2_extra_params(hidden_size=H, num_layers=2, vocab_size=V, conv_kernel_size=2, conv_group_size=16,
                                 selector_rank=8)
    assert sum(p.numel() for p in m.parameters()) - base == sum(extra.values())
    qwen = dflash2_extra_params(hidden_size=5120, num_layers=5, vocab_size=248320, conv_kernel_size=2,
                                conv_group_size=64, selector_rank=256)
    assert qwen["codebooks"] == 127_139_840
    with pytest.raises(ValueError, match="conv_group_size"):
        dflash2_extra_params(hidden_size=100, num_layers=1, vocab_size=V, conv_kernel_size=2, conv_group_size=64,
                             selector_rank=8)


def test_geometry_requires_the_dflash2_fields():
    with pytest.raises(ValueError, match="required"):
        replace(geometry("dflash"), kind="dflash2")
    with pytest.raises(ValueError, match="conv_group_size"):
        replace(geometry(), conv_group_size=48)


def test_save_load_round_trip_keeps_vllm_names(tmp_path):
    m = drafter()
    with torch.no_grad():
        m.candidate_selector.hidden_projection.weight.normal_()
        m.layers[0].attention_conv.kernel_projection.weight.normal_()
    names = set(m.state_dict())
    assert {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
            "candidate_selector.hidden_projection.weight", "layers.1.attention_conv.base_kernel",
            "layers.1.mlp_conv.kernel_projection.weight"} <= names
    assert m.state_dict()["layers.0.mlp_conv.base_kernel"].shape == (2, 2, H)
    from flashdraft.drafter.persistence import save_drafter
    from flashdraft.storage.layout import CONFIG_FILE, WEIGHTS_FILE
    save_drafter(m, tmp_path)
    import json

    from safetensors.torch import load_file
    loaded = DFlashDrafter(DrafterGeometry(**json.loads((tmp_path / CONFIG_FILE).read_text())), attn_impl="sdpa")
    loaded.load_state_dict(load_file(str(tmp_path / WEIGHTS_FILE)))
    loaded.set_frozen(m.embed_weight, m.lm_head_weight)
    feats = inputs()[0]
    assert torch.equal(loaded.eval().propose_block(feats, 4), m.propose_block(feats, 4))


def test_zlab_export_round_trip_and_vllm_config_keys(tmp_path):
    import json

    from flashdraft.components.export.export import _files_zlab
    from flashdraft.drafter.zlab import read_zlab

    m = drafter()
    with torch.no_grad():
        m.candidate_selector.hidden_projection.weight.normal_()
        m.layers[1].mlp_conv.base_kernel.normal_()
    for name, data in _files_zlab(m, "float32").items():
        (tmp_path / name).write_bytes(data)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert {k: config["dflash_config"][k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                    "selector_top_k")} == \
        {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": K}
    geometry, weights = read_zlab(tmp_path)
    assert geometry["kind"] == "dflash2"
    loaded = DFlashDrafter(DrafterGeometry(**geometry), attn_impl="sdpa")
    loaded.load_state_dict(weights)
    loaded.set_frozen(m.embed_weight, m.lm_head_weight)
    feats = inputs()[0]
    assert torch.equal(loaded.eval().propose_block(feats, 4), m.propose_block(feats, 4))
    config["dflash_config"]["output_multiplier"] = 2.0
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="output_multiplier"):
        read_zlab(tmp_path)
