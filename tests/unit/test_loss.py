"""Label alignment and the weighted, normalised CE against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from flashdraft.drafter.loss import block_labels, dflash_loss, slot_weights


def test_label_of_slot_k_is_token_at_anchor_plus_k():
    ids = torch.arange(100, 130)
    mask = torch.ones(30, dtype=torch.bool)
    mask[20] = False
    labels, valid = block_labels(ids, mask, torch.tensor([3, 15]), 8)
    assert labels[0].tolist() == list(range(104, 111))
    assert labels[1].tolist() == list(range(116, 123))
    assert valid[1].tolist() == [True, True, True, True, False, True, True]  # position 20 = 15 + 5 -> slot 5


def test_slot_weights_decay():
    w = slot_weights(16, 7.0)
    assert w[0] == 1.0 and w.shape == (15,)
    assert math.isclose(float(w[7]), math.exp(-1.0), rel_tol=1e-6)


@pytest.mark.parametrize("normalization", ["weights", "mask"])
def test_loss_equals_hand_computed_weighted_ce(normalization):
    torch.manual_seed(0)
    N, B, H, V, gamma = 3, 4, 8, 11, 2.0
    hidden = torch.randn(N, B, H, dtype=torch.float64, requires_grad=True)
    head = torch.randn(V, H, dtype=torch.float64)
    labels = torch.randint(0, V, (N, B - 1))
    valid = torch.tensor([[1, 1, 1], [1, 0, 1], [0, 0, 1]], dtype=torch.bool)
    num, den = 0.0, 0.0
    for n in range(N):
        for k in range(1, B):
            if not valid[n, k - 1]:
                continue
            logits = [float(hidden[n, k].detach() @ head[v]) for v in range(V)]
            lse = math.log(sum(math.exp(x) for x in logits))
            w = math.exp(-(k - 1) / gamma)
            num += w * (lse - logits[int(labels[n, k - 1])])
            den += w if normalization == "weights" else 1.0
    out = dflash_loss(hidden, head, labels, valid, gamma, normalization, chunk=2)
    assert math.isclose(float(out.loss), num / den, rel_tol=1e-9)
    assert out.count.tolist() == [2.0, 1.0, 3.0]
    # gradient equals autograd through the plain full-logits definition
    out.loss.backward()
    fused_grad = hidden.grad.clone()
    hidden.grad = None
    logp = torch.log_softmax(hidden[:, 1:] @ head.T, -1)
    ce = -logp.gather(-1, labels[..., None]).squeeze(-1)
    w = slot_weights(B, gamma).double()[None] * valid
    ref = (w * ce).sum() / (w.sum() if normalization == "weights" else valid.sum())
    ref.backward()
    torch.testing.assert_close(fused_grad, hidden.grad)
    assert torch.all(fused_grad[:, 0] == 0)  # slot 0 untrained


def test_accuracy_counts_argmax_hits():
    head = torch.eye(5)
    hidden = torch.zeros(1, 3, 5)
    hidden[0, 1, 2] = 5.0
    hidden[0, 2, 4] = 5.0
    out = dflash_loss(hidden, head, torch.tensor([[2, 1]]), torch.ones(1, 2, dtype=torch.bool), 7.0)
    assert out.correct.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])  # inductor: ~30-90 s
def test_fused_chunk_function_equals_the_eager_loop(monkeypatch, compiled):
    """The CUDA path's per-chunk function (`_softmax_grad`, compiled there) gives the eager loop's loss, per-row CE,
    accuracy and gradient; `compiled` runs it through torch.compile on this CPU, as CUDA runs it."""
    from flashdraft.drafter import loss as loss_mod

    torch.manual_seed(1)
    N, B, H, V = 5, 6, 16, 97
    hidden = torch.randn(N, B, H, requires_grad=True)
    head = torch.randn(V, H)
    labels = torch.randint(0, V, (N, B - 1))
    valid = torch.rand(N, B - 1) > 0.2
    eager = dflash_loss(hidden, head, labels, valid, 3.0, chunk=7)
    eager.loss.backward()
    eager_grad, hidden.grad = hidden.grad.clone(), None
    fn = torch.compile(loss_mod._softmax_grad, dynamic=True) if compiled else loss_mod._softmax_grad
    monkeypatch.setattr(loss_mod, "_chunk_fn", lambda h: fn)
    fused = dflash_loss(hidden, head, labels, valid, 3.0, chunk=7)  # 7 rows a chunk: the last one is ragged
    fused.loss.backward()
    torch.testing.assert_close(fused.loss, eager.loss)
    torch.testing.assert_close(fused.ce_sum, eager.ce_sum)
    assert torch.equal(fused.correct, eager.correct) and torch.equal(fused.count, eager.count)
    torch.testing.assert_close(hidden.grad, eager_grad)


def test_a_bf16_head_on_cpu_is_upcast_in_slabs_exactly(monkeypatch):
    """The memory-mapped bf16 LM head (production storage) on a CPU: loss, per-row CE and gradient equal those of
    its exact fp32 copy, computed a few head rows at a time (slabs smaller than the vocabulary)."""
    import flashdraft.perf.cpu_gemm as cpu_gemm

    monkeypatch.setattr(cpu_gemm, "SLAB_ROWS", 7)
    g = torch.Generator().manual_seed(3)
    head16 = torch.randn(50, 12, generator=g).bfloat16()
    hidden = torch.randn(4, 6, 12, generator=g, requires_grad=True)
    labels, valid = torch.randint(0, 50, (4, 5), generator=g), torch.rand(4, 5, generator=g) > 0.3
    out = dflash_loss(hidden, head16, labels, valid, 7.0)
    out.loss.backward()
    grad16, hidden.grad = hidden.grad.clone(), None
    ref = dflash_loss(hidden, head16.float(), labels, valid, 7.0)
    ref.loss.backward()
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.ce_sum, ref.ce_sum, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad16, hidden.grad, rtol=1e-6, atol=1e-6)
    x = torch.randn(3, 12, generator=g)
    assert cpu_gemm.upcast_matmul(x, head16).dtype == torch.float32
    torch.testing.assert_close(cpu_gemm.upcast_matmul(x, head16), x @ head16.float().T)
