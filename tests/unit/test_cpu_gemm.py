"""flashdraft/perf/cpu_gemm.py: a bf16 target's linear layers on a CPU without native bf16 GEMMs compute many-row inputs
in fp32 slabs of the stored weights, and leave single rows, autograd and bf16-capable CPUs alone."""

from __future__ import annotations

import pytest
import torch

import flashdraft.perf.cpu_gemm as cpu_gemm
from flashdraft.config import load_config
from flashdraft.target.model import set_cpu_threads


def _bf16_mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.SiLU(), torch.nn.Linear(40, 24, bias=False)).bfloat16()


def _fp32_reference(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The same layers on the exact fp32 values of the bf16 weights, each output rounded to bf16 as the layer
    returns it."""
    h = x
    for m in model:
        if isinstance(m, torch.nn.Linear):
            b = None if m.bias is None else m.bias.float()
            h = torch.nn.functional.linear(h.float(), m.weight.float(), b).bfloat16()
        else:
            h = m(h)
    return h


def test_many_rows_compute_in_fp32_slabs_and_keep_the_layer_dtype(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "native_narrow_gemm", lambda: False)
    monkeypatch.setattr(cpu_gemm, "SLAB_ROWS", 7)  # several slabs a weight
    model = _bf16_mlp()
    assert cpu_gemm.upcast_for_cpu(model) == 2
    x = torch.randn(3, cpu_gemm.MIN_ROWS, 24).bfloat16()
    with torch.no_grad():
        out = model(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, _fp32_reference(model, x), rtol=0, atol=0)


def test_few_rows_and_autograd_keep_the_native_gemm(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "native_narrow_gemm", lambda: False)
    model, plain = _bf16_mlp(), _bf16_mlp()
    cpu_gemm.upcast_for_cpu(model)
    calls = []
    real = cpu_gemm.upcast_matmul
    monkeypatch.setattr(cpu_gemm, "upcast_matmul", lambda x, w: calls.append(x.shape) or real(x, w))
    few = torch.randn(cpu_gemm.MIN_ROWS - 1, 24).bfloat16()
    with torch.no_grad():
        torch.testing.assert_close(model(few), plain(few), rtol=0, atol=0)
    many = torch.randn(2 * cpu_gemm.MIN_ROWS, 24).bfloat16()
    torch.testing.assert_close(model(many), plain(many), rtol=0, atol=0)  # grad enabled: autograd's own GEMM
    assert not calls
    with torch.no_grad():
        model(many)
    assert len(calls) == 2


def test_a_bf16_capable_cpu_or_an_fp32_model_is_left_alone(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "native_narrow_gemm", lambda: True)
    assert cpu_gemm.upcast_for_cpu(_bf16_mlp()) == 0
    monkeypatch.setattr(cpu_gemm, "native_narrow_gemm", lambda: False)
    assert cpu_gemm.upcast_for_cpu(_bf16_mlp().float()) == 0


@pytest.mark.parametrize("per_rank, expected", [(True, 1), (False, 2)])
def test_one_process_stages_take_the_whole_node_budget(per_rank, expected):
    """The rehearsal trains on 2 ranks of 1 thread: generate/extract/evaluate (one process) get both cores."""
    cfg = load_config(preset="tiny", overrides={"training.num_threads": 1, "training.nproc_per_node": 2})
    before = torch.get_num_threads()
    try:
        set_cpu_threads(cfg, "cpu", per_rank=per_rank)
        assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(before)


def test_slabs_under_autograd_are_not_the_reused_scratch(monkeypatch):
    """Outside autograd the slabs share one scratch buffer; a product autograd keeps for its backward must own
    its slab, or every gradient would see the last slab."""
    monkeypatch.setattr(cpu_gemm, "SLAB_ROWS", 5)
    w = torch.randn(17, 8).bfloat16()
    x = torch.randn(3, 8, requires_grad=True)
    out = cpu_gemm.upcast_matmul(x, w)
    (out * torch.arange(17.0)).sum().backward()
    torch.testing.assert_close(x.grad, (torch.arange(17.0)[None, :] * torch.ones(3, 1)) @ w.float())
    with torch.no_grad():
        torch.testing.assert_close(cpu_gemm.upcast_matmul(x, w), x @ w.float().T)
        g = torch.randn(3, 17)
        torch.testing.assert_close(cpu_gemm.upcast_matmul_t(g, w), g @ w.float())


def test_a_bf16_hybrid_target_runs_through_transformers_with_fp32_convolutions(monkeypatch):
    """The real Qwen3.5 hybrid code (Gated DeltaNet convolutions through transformers' helpers, gated attention,
    MLP) at toy width in bf16: switched layers keep every dtype consistent, the convolutions hold fp32 weights, and
    prefill and cached decode logits match the unswitched model's to bf16 rounding."""
    import copy

    from transformers import Qwen3_5ForCausalLM

    from flashdraft.target.model import tiny_qwen35_config

    monkeypatch.setattr(cpu_gemm, "native_narrow_gemm", lambda: False)
    torch.manual_seed(0)
    text = tiny_qwen35_config(num_layers=4, hidden=64).text_config
    text.vocab_size, text.pad_token_id, text.eos_token_id = 512, 0, 1
    plain = Qwen3_5ForCausalLM(text).bfloat16().eval()
    fast = copy.deepcopy(plain)
    switched = cpu_gemm.upcast_for_cpu(fast)
    convs = [m for m in fast.modules() if isinstance(m, torch.nn.Conv1d)]
    assert len(convs) == 3 and all(c.weight.dtype == torch.float32 for c in convs)
    assert switched == 3 + sum(isinstance(m, torch.nn.Linear) for m in fast.modules())
    ids = torch.randint(0, 512, (2, 20))
    with torch.no_grad():
        a, b = plain(input_ids=ids, use_cache=True), fast(input_ids=ids, use_cache=True)
        assert b.logits.dtype == torch.bfloat16
        torch.testing.assert_close(b.logits.float(), a.logits.float(), atol=0.05, rtol=0.05)
        nxt = a.logits[:, -1].argmax(-1, keepdim=True)
        a1 = plain(input_ids=nxt, cache=a.past_key_values, use_cache=True)
        b1 = fast(input_ids=nxt, cache=b.past_key_values, use_cache=True)
        torch.testing.assert_close(b1.logits.float(), a1.logits.float(), atol=0.05, rtol=0.05)


def test_the_scratch_first_made_under_inference_mode_serves_training_after(monkeypatch):
    """Evaluation (inference_mode) may be the first to need the scratch; the trainer's loss writes it next."""
    monkeypatch.setattr(cpu_gemm, "_scratch", {})
    w, x = torch.randn(9, 4).bfloat16(), torch.randn(2, 4)
    with torch.inference_mode():
        torch.testing.assert_close(cpu_gemm.upcast_matmul(x, w), x @ w.float().T)
    with torch.no_grad():
        torch.testing.assert_close(cpu_gemm.upcast_matmul(x, w), x @ w.float().T)
        torch.testing.assert_close(cpu_gemm.upcast_matmul_t(x @ w.float().T, w), (x @ w.float().T) @ w.float())
