"""The drafter's attention pattern seen through its outputs: no leakage from the anchor onward, packing isolation,
the inference API, and construction from the tiny target."""

from __future__ import annotations

import torch

from flashdraft.drafter.attention import BlockLayout
from flashdraft.drafter.dflash_drafter import DFlashDrafter
from flashdraft.drafter.geometry import DrafterGeometry, resolve_mask_token
from flashdraft.drafter.persistence import build_drafter, load_drafter, save_drafter
from flashdraft.target.model import load_hf_config, load_tokenizer

H, V, B, NF = 64, 97, 4, 3


def small_drafter(trainable_mask: bool = False, layers: int = 2) -> DFlashDrafter:
    g = DrafterGeometry(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                        rope_theta=10000.0, rms_norm_eps=1e-6, vocab_size=V, num_layers=layers, block_size=B,
                        target_layer_ids=[1, 2, 3], num_target_layers=6, mask_token_id=V - 1,
                        trainable_mask=trainable_mask)
    gen = torch.Generator().manual_seed(0)
    m = DFlashDrafter(g, attn_impl="sdpa")
    m.set_frozen(torch.randn(V, H, generator=gen), torch.randn(V, H, generator=gen))
    m.init_weights(1)
    with torch.no_grad():  # larger weights so every input visibly moves the output
        for p in m.parameters():
            if p.ndim == 2:
                p.mul_(5)
    return m.eval()


def run_blocks(m, feats, ids, anchors):
    S = feats.shape[0]
    layout = BlockLayout(S, B, anchors)
    return m(feats, layout, torch.arange(S), ids[anchors], anchors)


def test_context_at_or_after_anchor_does_not_leak_but_before_does():
    torch.manual_seed(0)
    m = small_drafter()
    S = 24
    feats, ids = torch.randn(S, NF * H), torch.randint(0, V - 1, (S,))
    anchors = torch.tensor([5, 7, 12])  # overlapping blocks (5..8 and 7..10) on purpose
    base = run_blocks(m, feats, ids, anchors)
    for pos in (12, 13, 20):  # at / after the last anchor
        pert = feats.clone()
        pert[pos] += 3.0
        out = run_blocks(m, pert, ids, anchors)
        assert torch.equal(out[2], base[2]), f"context position {pos} leaked into the block anchored at 12"
    pert = feats.clone()
    pert[7] += 3.0  # before anchor 12, at anchor 7, after anchor 5
    out = run_blocks(m, pert, ids, anchors)
    assert not torch.allclose(out[2], base[2], atol=1e-4), "context before the anchor must be visible"
    assert torch.equal(out[1], base[1]) and torch.equal(out[0], base[0])
    # other blocks' tokens never leak either
    ids2 = ids.clone()
    ids2[5] = (ids[5] + 1) % (V - 1)
    out = run_blocks(m, feats, ids2, anchors)
    assert torch.equal(out[1], base[1]) and torch.equal(out[2], base[2])
    assert not torch.allclose(out[0], base[0], atol=1e-4)


def test_packed_documents_are_isolated():
    torch.manual_seed(1)
    m = small_drafter()
    feats, ids = torch.randn(20, NF * H), torch.randint(0, V - 1, (20,))
    doc = torch.tensor([0] * 8 + [1] * 12)
    pos = torch.cat([torch.arange(8), torch.arange(12)])
    anchors = torch.tensor([14])
    lay = BlockLayout(20, B, anchors, doc, doc[anchors])
    base = m(feats, lay, pos, ids[anchors], pos[anchors])
    pert = feats.clone()
    pert[:8] += 3.0
    assert torch.equal(m(pert, lay, pos, ids[anchors], pos[anchors]), base)
    # the same block alone (document 1 unpacked) gives the same output
    alone = m(feats[8:], BlockLayout(12, B, anchors - 8), pos[8:], ids[anchors], pos[anchors])
    torch.testing.assert_close(alone, base, atol=1e-5, rtol=1e-5)


def test_propose_block_matches_training_forward_and_uses_block_size():
    torch.manual_seed(2)
    m = small_drafter(trainable_mask=True)
    S = 10
    feats, ids = torch.randn(S + 3, NF * H), torch.randint(0, V - 1, (S + 3,))
    draft = m.propose_block(feats[:S], int(ids[S]))
    assert draft.shape == (B - 1,) and draft.dtype == torch.long
    # training view: anchor at S over a longer sequence sees exactly features 0..S-1
    hidden = run_blocks(m, feats, ids, torch.tensor([S]))
    assert torch.equal(m.logits(hidden[0, 1:]).argmax(-1), draft)
    assert m.propose_block(feats[:S], int(ids[S]), block_size=2).shape == (1,)


def test_save_and_load_roundtrip(tmp_path, tiny_cfg):
    hf = load_hf_config(tiny_cfg.target)
    m = build_drafter(tiny_cfg, hf, seed=3)
    save_drafter(m, tmp_path / "d")
    loaded = load_drafter(tmp_path / "d")
    feats = torch.randn(12, m.geometry.num_features * m.geometry.hidden_size)
    assert torch.equal(m.eval().propose_block(feats, 7), loaded.propose_block(feats, 7))
    assert set(m.state_dict()) == set(loaded.state_dict())
    assert not any(k.startswith(("embed", "lm_head")) for k in m.state_dict())


def test_geometry_and_frozen_tensors_come_from_the_target(tiny_cfg):
    hf = load_hf_config(tiny_cfg.target)
    m = build_drafter(tiny_cfg, hf)
    g = m.geometry
    assert (g.hidden_size, g.num_heads, g.num_kv_heads, g.head_dim) == (256, 4, 2, 64)
    assert g.intermediate_size == hf.intermediate_size and g.rope_theta == 1_000_000.0
    assert g.target_layer_ids == tiny_cfg.layer_ids() and g.num_layers == tiny_cfg.drafter.num_layers
    assert m.fc.weight.shape == (256, 5 * 256)
    from flashdraft.target.model import load_causal_lm

    target = load_causal_lm(tiny_cfg.target, num_layers=1)
    assert torch.equal(m.embed_weight, target.model.embed_tokens.weight.float())
    assert torch.equal(m.lm_head_weight, target.lm_head.weight.float())
    assert all(not p.requires_grad for p in (m.embed_weight, m.lm_head_weight))


def test_mask_token_resolution_order(tiny_cfg):
    tok = load_tokenizer(tiny_cfg.target)
    V = len(tok)
    assert resolve_mask_token(5, tok, V) == (5, False)
    assert resolve_mask_token(None, tok, V + 8) == (V, False)  # unused embedding row
    mask_id, trainable = resolve_mask_token(None, tok, V)      # no free row, no mask token
    assert trainable and mask_id == tok.pad_token_id
    tok.add_special_tokens({"mask_token": "<|MASK|>"})
    assert resolve_mask_token(None, tok, V + 8) == (tok.mask_token_id, False)


def test_mask_init_mean_or_zero():
    m = small_drafter(trainable_mask=True)
    m.init_weights(1)
    torch.testing.assert_close(m.mask_embedding.detach(), m.embed_weight.mean(0))
    m.init_weights(1, "zero")
    assert not m.mask_embedding.detach().any()
    weights = {n: p.detach().clone() for n, p in m.named_parameters()}
    m.init_weights(1, "mean")  # the rest of the init does not depend on the mask choice
    assert all(torch.equal(p, weights[n]) for n, p in m.named_parameters() if n != "mask_embedding")


def test_activation_checkpointing_changes_memory_not_results():
    """mlp/layer recomputation gives the same loss and gradients as keeping every activation, and keeps fewer
    tensors alive between forward and backward (counted with saved-tensor hooks)."""
    import pytest

    torch.manual_seed(3)
    S = 40
    feats, ids = torch.randn(S, NF * H), torch.randint(0, V - 1, (S,))
    anchors = torch.tensor([3, 9, 17, 30])
    results, saved = {}, {}
    for mode in ("none", "mlp", "layer"):
        m = small_drafter(layers=3).train()
        m.set_activation_checkpointing(mode)
        count = [0]

        def pack(t, count=count):
            count[0] += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = run_blocks(m, feats, ids, anchors)
        loss = (out.float() ** 2).mean()
        loss.backward()
        results[mode] = (loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()})
        saved[mode] = count[0]
    for mode in ("mlp", "layer"):
        torch.testing.assert_close(results[mode][0], results["none"][0])
        for name, grad in results["none"][1].items():
            torch.testing.assert_close(results[mode][1][name], grad, msg=f"{mode}: {name}")
    assert saved["layer"] < saved["mlp"] < saved["none"]
    with pytest.raises(ValueError, match="activation checkpointing 'all'"):
        small_drafter().set_activation_checkpointing("all")
