"""The planner's resource model (components/plan/memory.py, resources.py): per-pool peaks with fits in the plan and
its JSON, the direction every lever moves the peak, the memory gate naming levers that do fit, calibration from
the checked-in H200 file, and the memory benchmark's child on a tiny shape. Accuracy against a measured peak is
`benchmarks/bench_memory.py`'s job, not a test's."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.components.plan.gpus import GPUS
from flashdraft.components.plan.memory import (
    LOSS_CHUNK_ELEMENTS,
    counts,
    layer_saved_bytes,
    selector_saved_bytes,
    trainer_memory,
)
from flashdraft.components.plan.planner import PlanGateError, make_plan, run_plan
from flashdraft.components.plan.resources import train_shape
from flashdraft.config import load_config
from flashdraft.drafter.loss import CHUNK_ELEMENTS
from flashdraft.perf.calibration import TrainShape, load_calibration

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "benchmarks" / "calibration" / "h200-2026-12-04.json"
# The production preset trains DFlash2 at layer recompute (docs/dflash2.md); the DFlash lever tests pin DFlash
# without recompute, the shape those figures were measured at.
DFLASH = ["drafter.kind=dflash", "training.activation_checkpointing=none"]


def _peak(overrides: list[str], device: str = "cuda") -> int:
    shape, _ = train_shape(load_config(preset="qwen3.6-27b", overrides=DFLASH + overrides))
    return trainer_memory(shape, device).peak_bytes


def test_plan_json_has_memory_per_pool_and_production_fits_b200():
    res = CliRunner().invoke(app, ["plan", "--preset", "qwen3.6-27b", "--json"])
    assert res.exit_code == 0, res.output
    mem = json.loads(res.output)["memory"]
    assert set(mem) == {"trainer", "inference"}
    train = mem["trainer"]
    assert train["gpu"] == "NVIDIA B200" and train["fits"] is True
    assert 0 < train["peak_bytes_per_gpu"] <= train["usable_bytes_per_gpu"]
    assert train["anchors_per_row"] == 10 * 512  # 8,192 tokens a rank of 800-token samples, 512 anchors each
    assert sum(train["parts"].values()) == train["peak_bytes_per_gpu"]
    assert mem["inference"]["gpu"].startswith("NVIDIA RTX PRO 6000") and mem["inference"]["fits"] is True
    # DFlash without recompute on an H200 does not hold the config's 5,120 anchors a row (the 2026-12-04 finding);
    # the preset's DFlash2 at layer recompute does (77 GiB predicted on the B200's FSDP2 x 8 row).
    h200 = make_plan(load_config(preset="qwen3.6-27b", overrides=["pools.trainer.gpu_type=h200", *DFLASH]))
    assert h200.memory["trainer"]["fits"] is False
    prod = make_plan(load_config(preset="qwen3.6-27b", overrides=["pools.trainer.gpu_type=h200"]))
    assert prod.memory["trainer"]["fits"] is True


def test_each_lever_moves_the_peak_the_right_way():
    base = _peak([])
    assert _peak(["training.tokens_per_step=16384"]) > base > _peak(["training.tokens_per_step=4096"])
    assert _peak(["drafter.max_anchors=1024"]) > base > _peak(["drafter.max_anchors=128"])
    # a draft vocabulary is a FLOPs lever, not a memory one: its head rows are gathered beside the full head
    assert _peak(["drafter.draft_vocab_size=32768"]) - base == 32768 * 5120 * 2
    assert _peak(["training.strategy=ddp"]) > base  # unsharded state plus DDP's buckets
    assert _peak(["drafter.num_layers=6"]) > base
    mlp, layer = _peak(["training.activation_checkpointing=mlp"]), _peak(["training.activation_checkpointing=layer"])
    assert base > mlp > layer
    # CPU terms: fp32 activations and the dense SDPA mask make the same step larger than on CUDA
    shape, _ = train_shape(load_config(preset="qwen3.6-27b", overrides=DFLASH))
    cpu, cuda = trainer_memory(shape, "cpu"), trainer_memory(shape, "cuda")
    assert cpu.peak_bytes > cuda.peak_bytes and cpu.phase == "forward: last layer's dense mask"
    assert "autocast bf16 weight copies" in cuda.parts and not any("mask" in k for k in cuda.parts)
    assert LOSS_CHUNK_ELEMENTS == CHUNK_ELEMENTS


def test_gate_refuses_a_trainer_that_would_not_fit_and_names_levers_that_do(tmp_path):
    cfg = load_config(preset="qwen3.6-27b", overrides={"drafter.kind": "dflash", "training.tokens_per_step": 65536,
                                                       "training.activation_checkpointing": "none",
                                                       "storage.root": f"memory://{tmp_path.name}"})
    with pytest.raises(PlanGateError) as exc:
        run_plan(cfg)
    msg = str(exc.value)
    assert "pool trainer (train)" in msg and "NVIDIA B200" in msg
    for lever in ("training.tokens_per_step", "drafter.max_anchors", "drafter.draft_vocab_size", "loss chunk",
                  "training.activation_checkpointing=layer"):
        assert lever in msg
    # the value the gate proposes does fit
    tokens = int(msg.split("training.tokens_per_step (now 65,536; <= ")[1].split(" fits")[0].replace(",", ""))
    assert run_plan(cfg.with_overrides({"training.tokens_per_step": tokens})).gate is None
    assert run_plan(cfg.with_overrides({"training.tokens_per_step": 8192})).memory["trainer"]["fits"] is True
    res = CliRunner().invoke(app, ["plan", "--preset", "qwen3.6-27b", "--gate", "--set", DFLASH[0], "--set",
                                   DFLASH[1], "--set", "training.tokens_per_step=32768"])
    assert res.exit_code == 3 and "training.tokens_per_step (now 32,768" in res.output


def test_local_cpu_presets_have_no_memory_gate():
    plan = make_plan(load_config(preset="tiny"))
    assert all(m["fits"] is None for m in plan.memory.values())
    assert plan.gate is None
    assert "drafter.num_heads" in plan.memory["trainer"]["assumed"]


def test_calibrate_replaces_rates_and_names_the_source():
    args = ["plan", "--preset", "qwen3.6-27b", "--set", "pools.trainer.gpu_type=h200"]
    plain = json.loads(CliRunner().invoke(app, args + ["--json"]).output)
    res = CliRunner().invoke(app, args + ["--calibrate", str(H200), "--json"])
    assert res.exit_code == 0, res.output
    cal = json.loads(res.output)
    hours = cal["gpu_hours"]
    assert "measured 3,159 tokens/s" in hours["train"]["rate_source"] and "b5e99d6" in hours["train"]["rate_source"]
    assert hours["train"]["tokens_per_s_per_gpu"] != plain["gpu_hours"]["train"]["tokens_per_s_per_gpu"]
    assert "measured" in hours["extract"]["rate_source"]
    assert hours["generate"]["rate_source"] == "assumed (model)"  # the file has no generation rate
    train = cal["memory"]["trainer"]
    assert train["measured_factor"] > 1 and "measured at" in train["peak_source"]
    assert train["peak_bytes_per_gpu"] > plain["memory"]["trainer"]["peak_bytes_per_gpu"]
    table = CliRunner().invoke(app, args + ["--calibrate", str(H200)])
    assert "calibration: one lent NVIDIA H200" in table.output and "assumed (model)" in table.output
    # an explicit plan.measured_tokens_per_s still wins over the file
    both = CliRunner().invoke(app, args + ["--calibrate", str(H200), "--set", "plan.measured_tokens_per_s.train=1000",
                                           "--json"])
    assert json.loads(both.output)["gpu_hours"]["train"]["tokens_per_s_per_gpu"] == 1000


def test_gpu_check_calibration_of_the_production_step_loads_with_its_recompute_modes():
    cal = json.loads((ROOT / "benchmarks" / "calibration" / "h200-2026-12-04-production.json").read_text())
    modes = [m["shape"]["activation_checkpointing"] for m in cal["train_memory"]]
    assert set(modes) == {"none", "mlp", "layer"}  # and the eager-loss A/B, again "none"
    plan = make_plan(load_config(preset="qwen3.6-27b", overrides={
        "pools.trainer.gpu_type": "h200", "training.activation_checkpointing": "mlp", "drafter.kind": "dflash",
        "plan.calibration": str(ROOT / "benchmarks" / "calibration" / "h200-2026-12-04-production.json")}))
    assert "5 x 5120, 512 anchors a sample, 8,192 tokens a step" in plan.memory["trainer"]["peak_source"]


def test_calibrate_bad_file_names_it(tmp_path):
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({"schema_version": 1}))
    res = CliRunner().invoke(app, ["plan", "--preset", "qwen3.6-27b", "--calibrate", str(bad)])
    assert res.exit_code == 1 and "cal.json" in res.output and "source" in res.output  # a setting to fix: 1


def test_bench_memory_child_runs_the_trainer_step_on_a_tiny_shape():
    spec = importlib.util.spec_from_file_location("bench_memory", ROOT / "benchmarks" / "bench_memory.py")
    bench = sys.modules["bench_memory"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = bench.compare("small", bench.SMALL)
    assert row["measured_bytes"] > 0 and row["predicted_bytes"] > 0 and row["anchors_per_row"] > 0
    assert row["phase"] in ("forward: last layer's dense mask", "loss", "backward", "optimizer step")
    assert "| small | 64 x 1 |" in bench.table([row])
    d2 = bench.compare("small-dflash2", bench.SMALL_DFLASH2)  # the DFlash2 trainer step (selector loss included)
    assert d2["measured_bytes"] > 0 and d2["phase"] == "selector loss"
    assert d2["parts"]["selector loss: saved for the backward"] > 0


# -- DFlash2 (drafter.kind=dflash2) ------------------------------------------------------------------------------


def _dflash2_shape(H, heads, kv, hd, inter, B, taps, gs, S, N, V=97, r=8, k=4, kind="dflash2", **kw) -> TrainShape:
    return TrainShape(hidden_size=H, num_layers=1, num_heads=heads, num_kv_heads=kv, head_dim=hd,
                      intermediate_size=inter, vocab_size=V, num_features=3, block_size=B, max_anchors=N,
                      tokens_per_step=S, anchors_per_row=N, kind=kind, conv_kernel_size=taps, conv_group_size=gs,
                      selector_rank=r, selector_top_k=k, **kw)


def _measured_layer_bytes(s: TrainShape, autocast: bool) -> int:
    """Bytes of the tensors autograd saves in one real `DFlashLayer` forward (saved-tensor hooks, each storage once),
    less what memory.py counts elsewhere: the weights and autocast's bf16 copies of them, the fused context, the RoPE
    tables. CPU, SDPA (the dense mask's float copy is in the count), fp32 or bf16 autocast."""
    import torch

    from flashdraft.drafter.attention import BlockLayout
    from flashdraft.drafter.dflash_drafter import DFlashDrafter
    from flashdraft.drafter.geometry import DrafterGeometry

    extra = dict(kind="dflash2", conv_kernel_size=s.conv_kernel_size, conv_group_size=s.conv_group_size,
                 selector_rank=s.selector_rank, selector_top_k=s.selector_top_k) if s.kind == "dflash2" else {}
    g = DrafterGeometry(hidden_size=s.hidden_size, num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                        head_dim=s.head_dim, intermediate_size=s.intermediate_size, rope_theta=1e4, rms_norm_eps=1e-6,
                        vocab_size=s.vocab_size, num_layers=1, block_size=s.block_size, target_layer_ids=[1, 2, 3],
                        num_target_layers=6, mask_token_id=s.vocab_size - 1, **extra)
    torch.manual_seed(0)
    m = DFlashDrafter(g, attn_impl="sdpa")
    m.set_frozen(torch.randn(g.vocab_size, g.hidden_size), torch.randn(g.vocab_size, g.hidden_size))
    m.init_weights(0)
    with torch.no_grad():  # non-zero delta projections (their init is 0), so no weight copy looks like another
        for p in m.parameters():
            p.add_(torch.randn(p.shape) * 0.01)
    m.set_activation_checkpointing(s.activation_checkpointing)
    m.train()
    S, N, B = s.tokens_per_step, int(s.anchors_per_row), s.block_size
    anchors = torch.arange(N) * ((S - 1) // N) + 1
    layout = BlockLayout(S, B, anchors)
    params = list(m.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ctx = m.fuse(torch.randn(S, 3 * g.hidden_size))[None]
        x = m.block_inputs(torch.randint(0, g.vocab_size - 1, (N,)), B).reshape(1, N * B, -1).detach()
        x.requires_grad_()
        pos = (anchors[:, None] + torch.arange(B)).reshape(-1)
        rope_q, rope_kv = m._cos_sin(pos), m._cos_sin(torch.cat([torch.arange(S), pos]))
        skip = {t.untyped_storage().data_ptr() for t in (*params, ctx, *rope_q, *rope_kv)}
        seen: dict[int, int] = {}

        def weight_copy(t) -> bool:
            return t.dtype == torch.bfloat16 and t.dim() == 2 and any(
                tuple(p.shape) == tuple(u.shape) and torch.equal(p.to(t.dtype), u)
                for p in params for u in (t, t.T))

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in skip and not weight_copy(t):
                seen.setdefault(ptr, t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m.layers[0](x, ctx, rope_q, rope_kv, layout, "sdpa")
    return sum(seen.values())


LAYER_SHAPES = [dict(H=48, heads=2, kv=1, hd=40, inter=112, B=4, taps=2, gs=16, S=37, N=5),
                dict(H=64, heads=4, kv=2, hd=24, inter=96, B=3, taps=4, gs=32, S=29, N=4),  # taps past the block
                dict(H=40, heads=1, kv=1, hd=56, inter=72, B=5, taps=1, gs=8, S=23, N=3)]


@pytest.mark.parametrize("dims", LAYER_SHAPES)
@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
@pytest.mark.parametrize("recompute", ["none", "mlp", "layer"])
def test_layer_saved_bytes_equal_the_real_layers_saved_tensors(dims, kind, recompute):
    """memory.py's per-layer bytes (DFlash's and DFlash2's block convolutions) are exactly what autograd saves in
    the real layer: fp32 against the CPU terms; CPU bf16 autocast against the CUDA terms, less FlexAttention's
    output copy for o_proj (2 B x heads x head_dim a position) and plus SDPA's bf16 copy of the dense mask."""
    s = _dflash2_shape(**dims, kind=kind, activation_checkpointing=recompute)
    g = counts(s)
    assert _measured_layer_bytes(s, autocast=False) == layer_saved_bytes(s, "cpu")[1]
    flex_copy, mask = 2 * s.num_heads * s.head_dim * g.positions, 2 * g.positions * g.keys
    cuda = layer_saved_bytes(s, "cuda")[1]
    assert _measured_layer_bytes(s, autocast=True) == cuda - flex_copy + mask if recompute != "layer" else cuda


def _measured_selector_bytes(s: TrainShape) -> int:
    """Bytes autograd saves in the trainer's selector step (`drafter_loss`: the slot-state gather, then
    `selector_loss`), every slot valid, outside autocast as in the trainer; the selector's weights and the head
    excluded (state)."""
    import torch

    from flashdraft.drafter.dflash2 import CandidateSelector, selector_loss
    from flashdraft.drafter.loss import dflash_loss

    H, V, N, B = s.hidden_size, s.vocab_size, int(s.anchors_per_row), s.block_size
    torch.manual_seed(0)
    selector = CandidateSelector(H, V, s.selector_rank, s.selector_top_k)
    selector.reset(torch.Generator().manual_seed(0), 0.02)
    head = torch.randn(V, H).to(torch.bfloat16 if s.head_dtype == "bfloat16" else torch.float32)
    hidden = torch.randn(N, B, H, requires_grad=True)
    labels, previous = torch.randint(0, V, (N, B - 1)), torch.randint(0, V, (N, B - 1))
    out = dflash_loss(hidden, head, labels, torch.ones(N, B - 1, dtype=torch.bool), 4.0, top_k=s.selector_top_k)
    skip = {t.untyped_storage().data_ptr() for t in (head, *selector.parameters())}
    seen: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        selector_loss(selector, hidden[:, 1:].reshape(-1, H)[out.rows], head, out.top_ids,
                      labels.reshape(-1)[out.rows], previous.reshape(-1)[out.rows], out.row_weight, "gold_topk",
                      s.selector_detach)
    return sum(seen.values())


@pytest.mark.parametrize("dims", [dict(H=48, B=4, N=5, V=97, r=8, k=4), dict(H=40, B=5, N=7, V=211, r=12, k=6),
                                  dict(H=72, B=3, N=9, V=64, r=20, k=2)])
@pytest.mark.parametrize("head", ["float32", "bfloat16"])
@pytest.mark.parametrize("detach", [False, True])
def test_selector_saved_bytes_equal_the_real_selector_loss(dims, head, detach):
    s = _dflash2_shape(heads=1, kv=1, hd=8, inter=16, taps=2, gs=8, S=64, head_dtype=head, selector_detach=detach,
                       **dims)
    assert _measured_selector_bytes(s) == selector_saved_bytes(s)[0]


H200_PRODUCTION = ROOT / "benchmarks" / "calibration" / "h200-2026-12-04-production.json"


def test_dflash2_h200_observations():
    """The production step on one H200, unsharded (benchmarks/calibration/h200-2026-12-04-production.json's
    dflash2 rows): recompute=layer peaked at 70.1 GiB; none and mlp ran out of memory."""
    cal = load_calibration(H200_PRODUCTION)
    rows = {m.shape.activation_checkpointing: m for m in cal.train_memory if m.shape.kind == "dflash2"}
    assert set(rows) == {"none", "mlp", "layer"}
    assert rows["none"].out_of_memory and rows["mlp"].out_of_memory and not rows["layer"].out_of_memory
    usable = GPUS["h200"].usable_bytes
    layer = trainer_memory(rows["layer"].shape, "cuda")
    assert abs(layer.peak_bytes / rows["layer"].peak_bytes - 1) <= 0.15, layer.peak_bytes / rows["layer"].peak_bytes
    assert abs(layer.peak_bytes / (70.1 * 2**30) - 1) <= 0.15
    for mode in ("none", "mlp"):
        predicted = trainer_memory(rows[mode].shape, "cuda").peak_bytes
        assert predicted > usable and predicted > rows[mode].peak_bytes  # an OOM row's peak is a lower bound
    # the DFlash rows of the same file still predict as before (0.97 / 1.04 / 1.01)
    ratios = {m.shape.activation_checkpointing: trainer_memory(m.shape, "cuda").peak_bytes / m.peak_bytes
              for m in cal.train_memory if m.shape.kind == "dflash" and m.note and "eager" not in m.note}
    assert {k: round(v, 2) for k, v in ratios.items()} == {"none": 0.97, "mlp": 1.04, "layer": 1.01}


def test_dflash2_adds_to_the_dflash_peak_and_dflash_is_unchanged():
    base = _peak([])
    assert base == 164_532_315_520  # the DFlash prediction before DFlash2 was modelled (qwen3.6-27b, FSDP2 x 8)
    d2 = _peak(["drafter.kind=dflash2"])
    assert d2 > base
    assert _peak(["drafter.kind=dflash2", "drafter.selector_top_k=4"]) <= d2
    assert _peak(["drafter.kind=dflash2", "training.activation_checkpointing=layer"]) < d2
    shape, _ = train_shape(load_config(preset="qwen3.6-27b", overrides=[*DFLASH, "drafter.kind=dflash2"]))
    est = trainer_memory(shape, "cuda")
    assert est.phase == "selector loss" and est.parts["selector loss: saved for the backward"] > 0
    # its state is dflash2_extra_params' 145.0M parameters (127.1M codebooks, 16.6M convolutions, 1.3M hidden
    # projection) at 4 B a copy, sharded over the 8 ranks
    dflash = trainer_memory(train_shape(load_config(preset="qwen3.6-27b", overrides=DFLASH))[0], "cuda")
    assert abs(est.parts["weights (fp32)"] - dflash.parts["weights (fp32)"] - 4 * 145_039_360 / 8) <= 1


def test_gate_refuses_an_over_budget_dflash2_trainer_naming_its_levers(tmp_path):
    cfg = load_config(preset="qwen3.6-27b", overrides={"drafter.kind": "dflash2", "storage.root": f"memory://{tmp_path.name}",
                                                       "training.activation_checkpointing": "none"})
    with pytest.raises(PlanGateError) as exc:
        run_plan(cfg)
    msg = str(exc.value)
    assert "pool trainer (train)" in msg and "selector loss" in msg.lower()
    for lever in ("drafter.selector_top_k (now 16", "drafter.selector_detach=true",
                  "training.activation_checkpointing=layer (recomputes in the backward; fits)"):
        assert lever in msg
    assert "drafter.draft_vocab_size" not in msg  # dflash2 needs the full vocabulary
    assert run_plan(cfg.with_overrides({"training.activation_checkpointing": "layer"})).gate is None
