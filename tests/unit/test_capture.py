"""Layer-id convention: captured id i == HF hidden_states[i + 1], on the tiny target and the real SmolLM2."""

from __future__ import annotations

import pytest
import torch

from flashdraft.config import load_config
from flashdraft.target.capture import capture_layers
from flashdraft.target.model import load_causal_lm


def _model_and_ids(preset: str):
    cfg = load_config(preset=preset)
    return load_causal_lm(cfg.target), cfg.layer_ids()


@pytest.mark.parametrize("preset", ["tiny", "smollm2-local"])
def test_captured_equals_hf_hidden_states_plus_one(preset):
    model, ids = _model_and_ids(preset)
    torch.manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (2, 37))
    with torch.inference_mode():
        ref = model(input_ids=input_ids, output_hidden_states=True).hidden_states
    with capture_layers(model, ids, stop_after_deepest=True) as cap:
        cap.forward(input_ids=input_ids)
        feats = cap.features()
    hidden = model.config.hidden_size
    assert feats.shape == (2, 37, len(ids) * hidden)
    for k, i in enumerate(ids):
        got = feats[..., k * hidden:(k + 1) * hidden]
        torch.testing.assert_close(got, ref[i + 1], rtol=0, atol=0)
        # The neighbouring index is a different tensor: the test would catch an off-by-one.
        assert not torch.allclose(got, ref[i])


def test_stop_after_deepest_skips_later_layers_and_head():
    model, ids = _model_and_ids("tiny")
    ran = []
    hooks = [model.model.layers[max(ids) + 1].register_forward_hook(lambda *a: ran.append("deeper")),
             model.model.norm.register_forward_hook(lambda *a: ran.append("norm")),
             model.lm_head.register_forward_hook(lambda *a: ran.append("lm_head"))]
    input_ids = torch.randint(0, model.config.vocab_size, (1, 12))
    with capture_layers(model, ids, stop_after_deepest=True) as cap:
        cap.forward(input_ids=input_ids)
    assert ran == []
    with capture_layers(model, ids) as cap, torch.inference_mode():  # full forward still works without stop
        model(input_ids=input_ids)
    assert ran == ["deeper", "norm", "lm_head"]
    for h in hooks:
        h.remove()
    assert all(not layer._forward_hooks for layer in model.model.layers)


def test_incremental_forwards_concatenate_along_sequence():
    from transformers import DynamicCache

    model, ids = _model_and_ids("tiny")
    input_ids = torch.randint(0, model.config.vocab_size, (1, 20))
    with capture_layers(model, ids) as cap, torch.inference_mode():
        model(input_ids=input_ids)
        full = cap.features()
        cache = DynamicCache(config=model.config)
        model(input_ids=input_ids[:, :13], cache=cache, use_cache=True)
        model(input_ids=input_ids[:, 13:], cache=cache, use_cache=True)
        inc = cap.features()
    torch.testing.assert_close(inc, full, rtol=1e-4, atol=1e-4)


def test_out_of_range_id_is_rejected():
    model, _ = _model_and_ids("tiny")
    with pytest.raises(ValueError, match="0-based"), capture_layers(model, [3, 8]):
        pass
