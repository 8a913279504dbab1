"""training.optimizer: which parameters Muon takes (components/train/optim.py), the state it keeps against the
memory model's count (components/plan/memory.py), and the plan naming the optimizer state."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from flashdraft.components.plan.memory import counts, muon_params, optimizer_state_parts
from flashdraft.components.train.optim import build_optimizers, muon_matrices
from flashdraft.drafter.dflash_drafter import DFlashDrafter
from flashdraft.drafter.geometry import DrafterGeometry
from flashdraft.perf.calibration import TrainShape
from flashdraft.perf.flops import muon_matrix_shapes, muon_step_flops

SHAPE = dict(hidden_size=48, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=40, intermediate_size=112,
             vocab_size=97, num_features=3, block_size=4, max_anchors=4, tokens_per_step=32, anchors_per_row=4,
             conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)


def _drafter(s: TrainShape) -> DFlashDrafter:
    extra = dict(kind="dflash2", conv_kernel_size=s.conv_kernel_size, conv_group_size=s.conv_group_size,
                 selector_rank=s.selector_rank, selector_top_k=s.selector_top_k) if s.kind == "dflash2" else {}
    g = DrafterGeometry(hidden_size=s.hidden_size, num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                        head_dim=s.head_dim, intermediate_size=s.intermediate_size, rope_theta=1e4, rms_norm_eps=1e-6,
                        vocab_size=s.vocab_size, num_layers=s.num_layers, block_size=s.block_size,
                        target_layer_ids=[1, 2, 3], num_target_layers=6, mask_token_id=s.vocab_size - 1, **extra)
    torch.manual_seed(0)
    m = DFlashDrafter(g, attn_impl="sdpa")
    m.set_frozen(torch.randn(g.vocab_size, g.hidden_size), torch.randn(g.vocab_size, g.hidden_size))
    m.init_weights(0)
    return m


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_muon_takes_the_linear_weights_and_the_memory_model_counts_its_state(kind):
    """Muon gets every trainable Linear weight (fc, attention, MLP; DFlash2's kernel and hidden projections) and
    nothing else: not the norms, not DFlash2's codebooks or base kernels. After one step the optimizers hold exactly
    the fp32 state memory.py plans: one buffer per Muon parameter, two per AdamW one."""
    s = TrainShape(**SHAPE, kind=kind, optimizer="muon")
    m = _drafter(s)
    params = [p for p in m.parameters() if p.requires_grad]
    names = {id(p): n for n, p in m.named_parameters()}
    on_muon = sorted(names[id(p)] for p in muon_matrices(m))
    assert "fc.weight" in on_muon and "layers.0.mlp.down_proj.weight" in on_muon
    assert not any("norm" in n or "codebook" in n or "base_kernel" in n for n in on_muon)
    if kind == "dflash2":
        assert "candidate_selector.hidden_projection.weight" in on_muon
        assert "layers.1.attention_conv.kernel_projection.weight" in on_muon
    assert muon_params(s) == sum(p.numel() for p in muon_matrices(m))
    assert sorted(muon_matrix_shapes(s)) == sorted(tuple(p.shape) for p in muon_matrices(m))
    assert counts(s).params == sum(p.numel() for p in params)
    opt = build_optimizers(m, params, "muon", lr=1e-3, weight_decay=0.0)
    muon, adamw = opt.parts  # torch's Muon (a whole matrix per step under FSDP2: WholeMatrixMuon), AdamW the rest
    assert isinstance(muon, torch.optim.Muon) and type(adamw) is torch.optim.AdamW
    for p in params:
        p.grad = torch.randn_like(p)
    with FlopCounterMode(display=False) as flops:  # the plan prices the Newton-Schulz products it runs
        opt.step()
    assert flops.get_total_flops() == muon_step_flops(s) > 0
    held = sum(4 * t.numel() for o in opt.parts for st in o.state.values() for k, t in st.items() if k != "step")
    assert held == sum(optimizer_state_parts(s).values())
    adamw = TrainShape(**SHAPE, kind=kind)
    assert optimizer_state_parts(adamw) == {"AdamW moments (fp32)": 8 * counts(adamw).params}


def test_one_lr_drives_both_optimizers_with_muons_scale():
    m = _drafter(TrainShape(**SHAPE))
    params = [p for p in m.parameters() if p.requires_grad]
    opt = build_optimizers(m, params, "muon", lr=1e-3, weight_decay=0.0, muon_lr_scale=10.0)
    opt.set_lr(2e-3)
    assert [g["lr"] for o in opt.parts for g in o.param_groups] == [2e-2, 2e-3]
    assert opt.parts[0].param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    with pytest.raises(ValueError, match="training.optimizer='sgd'"):
        build_optimizers(m, params, "sgd", lr=1e-3, weight_decay=0.0)


def test_the_cpu_muon_step_is_torchs_step_with_an_fp32_newton_schulz():
    """On CPU `WholeMatrixMuon` runs torch's Muon update with the iteration in fp32 (bf16 matmuls are ~45x slower
    on CPUs without native bf16): the orthogonalised update equals torch's bf16 one to bf16 precision, and the
    step (momentum, Nesterov, match_rms_adamw lr, weight decay) moves the weights as torch's does."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from flashdraft.components.train.optim import WholeMatrixMuon, newton_schulz

    g = torch.randn(24, 40, generator=torch.Generator().manual_seed(0))
    coeffs = (3.4445, -4.775, 2.0315)
    for m in (g, g.T):  # wide and tall
        ours, torchs = newton_schulz(m, coeffs, 5, 1e-7), _zeropower_via_newtonschulz(m, coeffs, 5, 1e-7).float()
        assert ours.dtype == torch.float32 and ours.shape == m.shape
        assert (ours - torchs).norm() / torchs.norm() < 0.02
    weights = [torch.nn.Parameter(torch.randn(24, 40, generator=torch.Generator().manual_seed(1))) for _ in range(2)]
    hyper = dict(lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    opts = [WholeMatrixMuon([weights[0]], **hyper), torch.optim.Muon([weights[1]], **hyper)]
    start = weights[0].detach().clone()
    for step in range(3):
        grad = torch.randn(24, 40, generator=torch.Generator().manual_seed(10 + step))
        for w, opt in zip(weights, opts, strict=True):
            w.grad = grad.clone()
            opt.step()
    moved = weights[1].detach() - start
    assert moved.norm() > 0.005 * start.norm(), "three steps moved the weights"
    assert (weights[0].detach() - weights[1].detach()).norm() / moved.norm() < 0.02
    assert set(opts[0].state[weights[0]]) == {"momentum_buffer"}


def test_plan_shows_the_optimizer_state_it_plans_for():
    from flashdraft.components.plan.planner import make_plan, memory_markdown
    from flashdraft.config import load_config

    plans = {o: make_plan(load_config(preset="qwen3.6-27b", overrides=[f"training.optimizer={o}"]))
             for o in ("adamw", "muon")}
    lines = {o: "\n".join(memory_markdown(plan)) for o, plan in plans.items()}
    assert "optimizer state per trainer GPU (training.optimizer): AdamW moments (fp32)" in lines["adamw"]
    assert "Muon momentum (fp32)" in lines["muon"] and "Muon momentum" not in lines["adamw"]
    flops = {o: plan.train_flops_per_step for o, plan in plans.items()}  # the step's time follows its FLOPs
    assert "Muon Newton-Schulz" not in flops["adamw"] and flops["muon"]["Muon Newton-Schulz"] > 0
    assert {k: v for k, v in flops["muon"].items() if k != "Muon Newton-Schulz"} == flops["adamw"]
