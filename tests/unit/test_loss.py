"""Label alignment and the weighted, normalised CE against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from flashdraft.drafter.loss import block_labels, dflash_loss, dpace_weights, slot_weights


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


def test_dpace_weights_of_the_worked_vector():
    """q = [0.8, 0.5], alpha 0.5 by hand: q~ = [0.9, 0.75], C = [0.9, 0.9 * 0.75 = 0.675], w = [0.9 + 0.675, 0.675]
    = [1.575, 0.675]; alpha 1 makes every q~ 1: C = [1, 1, 1], w = [3, 2, 1] (slots left in the block)."""
    ce = -torch.log(torch.tensor([[0.8, 0.5]], dtype=torch.float64))
    w = dpace_weights(ce, torch.ones(1, 2, dtype=torch.bool), 0.5)
    torch.testing.assert_close(w, torch.tensor([[1.575, 0.675]], dtype=torch.float64))
    w1 = dpace_weights(torch.rand(1, 3), torch.ones(1, 3, dtype=torch.bool), 1.0)
    torch.testing.assert_close(w1, torch.tensor([[3.0, 2.0, 1.0]]))


def test_a_masked_dpace_slot_weighs_nothing_and_equals_deleting_it():
    ce = -torch.log(torch.tensor([[0.8, 0.01, 0.5], [0.3, 0.6, 0.9]], dtype=torch.float64))
    valid = torch.tensor([[True, False, True], [True, True, False]])
    w = dpace_weights(ce, valid, 0.5)
    torch.testing.assert_close(w[0], torch.tensor([1.575, 0.0, 0.675], dtype=torch.float64))
    # second block, by hand: q~ = [0.65, 0.8], C = [0.65, 0.52], w = [1.17, 0.52, 0]
    torch.testing.assert_close(w[1], torch.tensor([1.17, 0.52, 0.0], dtype=torch.float64))
    assert not w.requires_grad


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5])
def test_dpace_alpha_outside_0_1_is_refused(alpha):
    with pytest.raises(ValueError, match=r"drafter.dpace_alpha=.*\(0, 1\]"):
        dpace_weights(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), alpha)


@pytest.mark.parametrize("normalization,loss", [("weights", 0.3641447), ("mask", 0.4096628)])
def test_dpace_loss_and_gradient_of_a_worked_block(normalization, loss):
    """One block of B = 3 over a 2-token vocabulary, identity head: slot 1's logits [ln 0.8, ln 0.2] give the label
    (token 0) probability 0.8, slot 2's [0, 0] give 0.5. CE = [0.2231436, 0.6931472], w = [1.575, 0.675]:
    sum(w * CE) = 0.3514511 + 0.4678744 = 0.8193255, over sum(w) = 2.25 -> 0.3641447, over 2 slots -> 0.4096628.
    The weights are constants to the gradient: d/d(logits_j) = w_j / 2.25 * (softmax_j - onehot) =
    0.7 * [-0.2, 0.2] and 0.3 * [-0.5, 0.5] (weights normalisation)."""
    hidden = torch.tensor([[[9.0, 9.0], [math.log(0.8), math.log(0.2)], [0.0, 0.0]]], dtype=torch.float64,
                          requires_grad=True)
    head = torch.eye(2, dtype=torch.float64)
    out = dflash_loss(hidden, head, torch.tensor([[0, 0]]), torch.ones(1, 2, dtype=torch.bool), 7.0, normalization,
                      weighting="dpace", dpace_alpha=0.5)
    assert math.isclose(float(out.loss), loss, rel_tol=1e-6)
    denom = 2.25 if normalization == "weights" else 2.0
    torch.testing.assert_close(out.row_weight, torch.tensor([1.575, 0.675], dtype=torch.float64) / denom)
    out.loss.backward()
    if normalization == "weights":
        expected = torch.tensor([[[0.0, 0.0], [-0.14, 0.14], [-0.15, 0.15]]], dtype=torch.float64)
        torch.testing.assert_close(hidden.grad, expected)


@pytest.mark.parametrize("fused_chunks", [False, True], ids=["cpu-eager", "cuda-chunk-function"])
def test_dpace_loss_equals_the_plain_definition_with_detached_weights(monkeypatch, fused_chunks):
    """Random blocks with masked slots, in ragged chunks: the fused loss and gradient equal autograd through the
    full-logits definition, the weights computed from detached CE (both per-chunk paths: CPU's in-place loop and
    the function CUDA compiles)."""
    from flashdraft.drafter import loss as loss_mod

    if fused_chunks:
        monkeypatch.setattr(loss_mod, "_chunk_fn", lambda h: loss_mod._softmax_grad)
    torch.manual_seed(4)
    N, B, H, V, alpha = 4, 6, 8, 13, 0.3
    hidden = torch.randn(N, B, H, dtype=torch.float64, requires_grad=True)
    head = torch.randn(V, H, dtype=torch.float64)
    labels = torch.randint(0, V, (N, B - 1))
    valid = torch.rand(N, B - 1) > 0.25
    out = dflash_loss(hidden, head, labels, valid, 7.0, chunk=3, weighting="dpace", dpace_alpha=alpha)
    out.loss.backward()
    fused_grad, hidden.grad = hidden.grad.clone(), None
    ce = -torch.log_softmax(hidden[:, 1:] @ head.T, -1).gather(-1, labels[..., None]).squeeze(-1)
    w = dpace_weights(ce.detach(), valid, alpha)
    ref = (w * ce).sum() / w.sum()
    ref.backward()
    torch.testing.assert_close(out.loss, ref)
    torch.testing.assert_close(fused_grad, hidden.grad)
