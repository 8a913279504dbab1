"""The target's linears on oneDNN-packed weights (components/evaluate/cpu_kernels.py): one-row calls are the stock
kernel's bit for bit, multi-row calls agree with it to fp32 rounding, and a packed target still decodes its own
greedy tokens."""

from __future__ import annotations

import pytest
import torch

from flashdraft.components.evaluate.cpu_kernels import (
    PACKED_MIN_ROWS,
    PackedLinear,
    linear_weight_bytes,
    pack_for_cpu,
    pack_linears,
    packed_kernels_available,
)
from flashdraft.components.evaluate.spec import target_generate
from flashdraft.config import load_config
from flashdraft.target.model import load_causal_lm, load_tokenizer

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_linear_matches_the_stock_one(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 160, bias=bias)
    packed = PackedLinear(linear)
    few, rows = torch.randn(1, PACKED_MIN_ROWS - 1, 96), torch.randn(1, 8, 96)
    with torch.inference_mode():
        assert torch.equal(packed(few), linear(few)), "fewer rows than PACKED_MIN_ROWS take the stock kernel"
        got, want = packed(rows), linear(rows)
    assert got.shape == want.shape == (1, 8, 160)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert packed.weight is linear.weight


def test_a_packed_target_decodes_the_same_greedy_tokens():
    cfg = load_config(preset="tiny")
    tok = load_tokenizer(cfg.target)
    stock, packed = load_causal_lm(cfg.target), load_causal_lm(cfg.target)
    assert packed_kernels_available(packed)
    linears = sum(type(m) is torch.nn.Linear for m in packed.modules())
    assert pack_linears(packed) == linears > 0
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == linears
    assert pack_linears(packed) == 0, "packing twice wraps nothing again"
    prompt = tok("Name three colours:")["input_ids"]
    assert target_generate(packed, prompt, 12, set()).tokens == target_generate(stock, prompt, 12, set()).tokens


def test_packing_is_skipped_when_the_copy_would_not_fit():
    cfg = load_config(preset="tiny")
    model = load_causal_lm(cfg.target)
    assert linear_weight_bytes(model) > 0
    assert pack_for_cpu(model, memory_share=0.0) == "stock"
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    assert pack_for_cpu(model) == "onednn-packed"
    assert any(isinstance(m, PackedLinear) for m in model.modules())
