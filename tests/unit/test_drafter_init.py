"""Recipe pieces of the drafter's start: init from the target's own layers, the trainable mask embedding's
start, and the draft vocabulary's choice and label mapping."""

from __future__ import annotations

import torch

from flashdraft.drafter.persistence import build_drafter
from flashdraft.drafter.vocab import count_response_tokens, draft_labels, top_tokens
from flashdraft.target.model import load_hf_config, target_init


def test_init_from_target_copies_the_named_layers_and_final_norm(tiny_cfg):
    cfg = tiny_cfg.with_overrides({"drafter.num_layers": 2, "drafter.init": "target", "drafter.init_layers": [5, 7]})
    model = build_drafter(cfg, load_hf_config(cfg.target), seed=0)
    layers, norm = target_init(cfg.target, [5, 7])
    for i in range(2):
        own = dict(model.layers[i].named_parameters())
        assert layers[i] and all(torch.equal(own[k], v.float()) for k, v in layers[i].items() if k in own)
    assert torch.equal(model.norm.weight, norm.float())
    rand = build_drafter(tiny_cfg.with_overrides({"drafter.num_layers": 2, "drafter.init": "random"}),
                         load_hf_config(cfg.target), seed=0)
    assert not torch.equal(rand.layers[0].mlp.up_proj.weight, model.layers[0].mlp.up_proj.weight)


def test_trainable_mask_embedding_starts_at_the_mean_target_embedding(tiny_cfg):
    model = build_drafter(tiny_cfg.with_overrides({"drafter.init": "random"}), load_hf_config(tiny_cfg.target),
                          seed=0)
    assert model.mask_embedding is not None  # the tiny tokenizer has no free row
    assert torch.allclose(model.mask_embedding, model.embed_weight.float().mean(0))


def test_draft_vocab_is_the_most_frequent_response_tokens_and_maps_labels():
    samples = [{"input_ids": torch.tensor([9, 9, 9, 1, 1, 2, 3, 3]),
                "loss_mask": torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])}]
    counts = count_response_tokens(samples, 10)
    assert counts.tolist() == [0, 2, 1, 2, 0, 0, 0, 0, 0, 0]  # prompt tokens (9) are not counted
    d2t = top_tokens(counts, 2)
    assert d2t.tolist() == [1, 3]
    t2d = torch.full((10,), -1)
    t2d[d2t] = torch.arange(2)
    labels, valid = draft_labels(torch.tensor([[3, 2, 1]]), torch.tensor([[True, True, False]]), t2d)
    assert labels.tolist() == [[1, 0, 0]] and valid.tolist() == [[True, False, False]]
