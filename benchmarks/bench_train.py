"""Training-step benchmark on the CPU reference geometry, side by side with speculators 0.9.0's DFlash.

Geometry: SmolLM2-135M-Instruct target (30 layers, hidden 576, vocab 49152), 1 drafter layer, one sequence of 512
tokens (a chat prompt + the target's own greedy response, features captured from the real target), 64 anchors,
block 16, 2 threads; median of >= 10 timed steps after warm-up. A step = forward + loss + backward + AdamW.

Equal loss definition: hard-label CE over slots 1..15 with w_k = exp(-(k-1)/gamma), normalised by the number of
valid slots (our `loss_normalization=mask`, speculators' `ce` loss). Speculators takes its labels from the
verifier's argmax at anchor+k-1, we take the data token at anchor+k: the response is the target's greedy output,
so they are the same tokens. Speculators runs in its own venv (`make bench-venv`: .venv-bench with
torch==2.13.0 and `--no-deps speculators==0.9.0 hs-connectors==0.9.0`), as `draft_attn_impl="sdpa"` with the
eager loss, on the identical batch (handed over as a safetensors file); its layer ids are ours + 1.

    .venv/bin/python benchmarks/bench_train.py [--steps 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SEQ, ANCHORS, BLOCK, GAMMA = 512, 64, 16, 7.0
# torch threads for both sides; 1 where other jobs share the cores (a 2-thread pool stalls on a descheduled peer)
THREADS = int(os.environ.get("FLASHDRAFT_BENCH_THREADS", "2"))
PROMPT = ("Write a long, detailed essay on the history of computing, from mechanical calculators and Babbage's "
          "engines through vacuum tubes, transistors, integrated circuits, personal computers, the internet and "
          "smartphones. Cover the key people, machines and ideas in each era.")
ROOT = Path(__file__).resolve().parent.parent
BENCH_PY = ROOT / ".venv-bench" / "bin" / "python"


class PeakRSS:
    """Peak resident memory above the level at start, sampled every 2 ms (CPU tensors are not tracked otherwise)."""

    def __init__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    @property
    def peak_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def make_batch(path: Path) -> None:
    """Prompt + greedy response from the real SmolLM2 target, padded/cut to SEQ, with its layer features."""
    import torch
    from safetensors.torch import save_file

    from flashdraft.config import load_config
    from flashdraft.target.capture import capture_layers
    from flashdraft.target.model import load_causal_lm, load_tokenizer

    cfg = load_config(preset="smollm2-local")
    tok = load_tokenizer(cfg.target)
    model = load_causal_lm(cfg.target)
    prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=SEQ - prompt.shape[1], min_new_tokens=SEQ - prompt.shape[1],
                             do_sample=False)
    ids = out[0, :SEQ]
    loss_mask = torch.zeros(SEQ, dtype=torch.uint8)
    loss_mask[prompt.shape[1]:] = 1
    layer_ids = cfg.layer_ids(30)
    with torch.no_grad(), capture_layers(model, layer_ids + [29]) as cap:
        model.model(input_ids=ids[None])
        feats = cap.features()[0]
    H = model.config.hidden_size
    save_file({"input_ids": ids.contiguous(), "loss_mask": loss_mask, "features": feats[:, :-H].contiguous(),
               "last_hidden": feats[:, -H:].contiguous(), "layer_ids": torch.tensor(layer_ids)}, str(path))


def time_steps(step, steps: int, warmup: int) -> dict:
    """Wall seconds per step, and CPU seconds per step (all threads): the CPU time is what stays comparable when
    other jobs share the machine."""
    for _ in range(warmup):
        step()
    wall, cpu = [], []
    with PeakRSS() as mem:
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {"step_s": wall, "cpu_s": cpu, "peak_mb": mem.peak_mb}


def bench_flashdraft(path: Path, steps: int, warmup: int, device: str = "cpu", impl: str = "sdpa",
                     head_dtype: str = "float32") -> dict:
    import torch
    from safetensors.torch import load_file

    from flashdraft.config import load_config
    from flashdraft.drafter.attention import BlockLayout
    from flashdraft.drafter.loss import block_labels, dflash_loss
    from flashdraft.drafter.persistence import build_drafter
    from flashdraft.target.model import load_hf_config

    torch.set_num_threads(THREADS)
    b = load_file(str(path))
    cfg = load_config(preset="smollm2-local", overrides={"drafter.num_layers": 1, "drafter.block_size": BLOCK,
                                                         "drafter.max_anchors": ANCHORS,
                                                         "drafter.loss_normalization": "mask"})
    model = build_drafter(cfg, load_hf_config(cfg.target), seed=0, attn_impl=impl, device=device).train()
    if head_dtype == "bfloat16":  # drafter.head_dtype=bfloat16: bf16 logits GEMMs, fp32 softmax/CE
        model.set_frozen(model.embed_weight.bfloat16(), model.lm_head_weight.bfloat16())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=6e-4)
    ids, lm = b["input_ids"].long(), b["loss_mask"].bool()
    feats = b["features"].float().to(device)
    gen = torch.Generator().manual_seed(0)
    cand = (lm[:-1] & lm[1:])[: SEQ - BLOCK].nonzero().flatten()
    anchors = cand[torch.randperm(cand.numel(), generator=gen)[:ANCHORS]].sort().values
    labels, valid = (t.to(device) for t in block_labels(ids, lm, anchors, BLOCK))
    ids, anchors, pos = ids.to(device), anchors.to(device), torch.arange(SEQ, device=device)
    cuda = device.startswith("cuda")
    losses = []

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            hidden = model(feats, BlockLayout(SEQ, BLOCK, anchors), pos, ids[anchors], anchors)
        out = dflash_loss(hidden, model.lm_head_weight, labels, valid, GAMMA, "mask")
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))  # also synchronises CUDA

    r = time_steps(step, steps, warmup)
    if cuda:
        r["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    name = "flashdraft" + (f" {device} {impl}" if cuda else "") + (" bf16 head" if head_dtype == "bfloat16" else "")
    return {"impl": name, **r, "first_loss": losses[0]}


def bench_speculators(path: Path, steps: int, warmup: int) -> dict:
    """Runs inside .venv-bench."""
    import torch
    from safetensors.torch import load_file
    from speculators.losses.utils import resolve_loss_config
    from speculators.models.dflash import DFlashDraftModel
    from speculators.train.cli import create_transformer_layer_config

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    b = load_file(str(path))
    verifier = os.environ["FLASHDRAFT_BENCH_VERIFIER"]
    layer_cfg = create_transformer_layer_config(verifier, num_layers=1, draft_arch="qwen3", hidden_act=None,
                                                sliding_window=2048, full_attention_indices=[0])
    aux_ids = [i + 1 for i in b["layer_ids"].tolist()]  # speculators/vLLM ids = z-lab ids + 1
    model = DFlashDraftModel.from_training_args(
        layer_cfg, draft_vocab_size=layer_cfg.vocab_size, block_size=BLOCK, target_layer_ids=aux_ids,
        verifier_name_or_path=verifier, mask_token_id=int(os.environ.get("FLASHDRAFT_BENCH_MASK_ID", "2")),
        draft_attn_impl="sdpa").float().train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=6e-4)
    loss_config = resolve_loss_config("ce", "eager")
    T = b["input_ids"].numel()
    kw = {"hidden_states": b["features"].float()[None], "input_ids": b["input_ids"].long()[None],
          "loss_mask": b["loss_mask"].long()[None], "verifier_last_hidden_states": b["last_hidden"].float()[None],
          "document_ids": torch.zeros(1, T, dtype=torch.long), "loss_config": loss_config, "gamma": GAMMA,
          "max_anchors": ANCHORS}
    losses = []

    def step():
        _, loss, _ = model(**kw)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))

    return {"impl": "speculators 0.9.0", **time_steps(step, steps, warmup), "first_loss": losses[0]}


# ---------------------------------------------------------------------------------------------------------------
# Learning efficiency: flashdraft vs speculators on identical features, plan and schedule; codec quality gate.
# ---------------------------------------------------------------------------------------------------------------


def block_metrics(logits, labels, valid, gamma: float, drafts=None) -> dict:
    """Sums over blocks for held-out metrics; torch only (runs in both venvs). logits [N, B-1, V] for slots
    1..B-1, labels/valid [N, B-1]; drafts [N, B-1] the drafted tokens when they are not the argmax (DFlash2's
    selector walk). The accepted run of a block is its count of leading correct slots: with the data being the
    target's greedy output, 1 + its mean is the tau greedy speculative decoding would get."""
    import torch
    import torch.nn.functional as F

    N, B1, V = logits.shape
    ce = F.cross_entropy(logits.reshape(-1, V).float(), labels.reshape(-1), reduction="none").view(N, B1)
    valid = valid.bool()
    correct = ((logits.argmax(-1) if drafts is None else drafts) == labels) & valid
    w = torch.exp(-torch.arange(B1, dtype=torch.float64) / gamma).float()[None, :]
    vf = valid.float()
    lf = (valid & torch.isfinite(ce)).float()  # a draft vocabulary cannot score tokens outside it: no loss there
    ce = torch.nan_to_num(ce, posinf=0.0)
    return {"ce_pos": (ce * lf).sum(0).tolist(), "correct_pos": correct.float().sum(0).tolist(),
            "count_pos": vf.sum(0).tolist(), "wloss": float((ce * w * lf).sum()), "wsum": float((w * lf).sum()),
            "accepted": float(correct.long().cumprod(1).sum()), "blocks": N}


def reduce_metrics(parts: list[dict]) -> dict:
    """Held-out loss (weighted CE, SpecForge normalisation for both sides), per-position accuracy, offline tau."""
    B1 = len(parts[0]["count_pos"])
    cnt = [max(1.0, sum(p["count_pos"][k] for p in parts)) for k in range(B1)]
    return {"loss": sum(p["wloss"] for p in parts) / max(1e-9, sum(p["wsum"] for p in parts)),
            "acc_pos": [sum(p["correct_pos"][k] for p in parts) / cnt[k] for k in range(B1)],
            "tau": 1.0 + sum(p["accepted"] for p in parts) / max(1, sum(p["blocks"] for p in parts))}


def curve_points(n_steps: int, every: int) -> list[int]:
    return sorted({0, n_steps, *range(every, n_steps, every)})


def write_curve_inputs(path: Path, train: list[dict], held: list[dict], plan: dict) -> None:
    """The peer's copy of the data: every sample's ids/mask/features (bf16, exactly what flashdraft reads) and
    the plan (per step: sample indices and their anchors; held-out anchors; lr per step) as JSON."""
    from safetensors.torch import save_file

    tensors = {}
    for i, s in enumerate(train + held):
        tensors[f"ids.{i}"] = s["input_ids"].long().contiguous()
        tensors[f"mask.{i}"] = s["loss_mask"].to(torch_uint8()).contiguous()
        tensors[f"feat.{i}"] = s["features"].contiguous()
    save_file(tensors, str(path))
    path.with_suffix(".json").write_text(json.dumps(plan))


def torch_uint8():
    import torch

    return torch.uint8


def build_plan(cfg, train: list[dict], held: list[dict], max_steps: int, every: int) -> dict:
    """Steps in flashdraft's order: per epoch a seeded shuffle, greedy token-budget rows (drafter/batch.py), the
    anchors flashdraft's `pack` draws (a pure function of seed, epoch, sample id)."""
    import torch

    from flashdraft.drafter.anchors import eligible_anchors, sample_anchors
    from flashdraft.drafter.batch import group_sizes

    d, t = cfg.drafter, cfg.training
    steps: list[dict] = []
    epoch = 0
    while len(steps) < max_steps and epoch < t.epochs:  # as the trainer: max_steps caps, the epochs bound
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(t.seed * 1000 + epoch)).tolist()
        start = 0
        for n in group_sizes([min(int(train[i]["input_ids"].numel()), t.tokens_per_step) for i in order],
                             t.tokens_per_step):
            idx = order[start:start + n]
            start += n
            anchors = [sample_anchors(train[i]["loss_mask"], d.block_size, d.max_anchors, seed=t.seed, epoch=epoch,
                                      sample_id=str(train[i]["sample_id"])).tolist() for i in idx]
            steps.append({"epoch": epoch, "samples": idx, "anchors": anchors})
        epoch += 1
    steps = steps[:max_steps]
    held_anchors = [eligible_anchors(s["loss_mask"], d.block_size).tolist() for s in held]
    return {"steps": steps, "held_anchors": held_anchors, "n_train": len(train), "block_size": d.block_size,
            "gamma": d.resolved_gamma, "points": curve_points(len(steps), every)}


def run_flashdraft_curve(cfg, train: list[dict], held: list[dict], plan: dict, label: str,
                         held_eval: list[dict] | None = None) -> dict:
    """flashdraft's own trainer pieces (build_model, micro_step, lr_at, clip, AdamW) on the plan's steps."""
    import torch

    from flashdraft.components.train.distributed import DistEnv
    from flashdraft.components.train.trainer import build_model, lr_at, micro_step
    from flashdraft.drafter.batch import pack
    from flashdraft.drafter.loss import block_labels
    from flashdraft.features.shard import Sample

    torch.set_num_threads(THREADS)
    torch.manual_seed(cfg.training.seed)
    env = DistEnv(0, 1, 0, torch.device("cpu"))
    model = build_model(cfg, env)
    if model.d2t is not None:
        from flashdraft.drafter.vocab import count_response_tokens, top_tokens

        model.set_draft_vocab(top_tokens(count_response_tokens(train, model.geometry.vocab_size),
                                         model.geometry.draft_vocab_size))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.training.lr, weight_decay=cfg.training.weight_decay)
    steps, B, gamma = plan["steps"], plan["block_size"], plan["gamma"]
    held_eval = held_eval or held

    @torch.no_grad()
    def evaluate() -> dict:
        model.eval()
        parts = []
        for s, anchors in zip(held_eval, plan["held_anchors"], strict=True):
            a = torch.tensor(anchors, dtype=torch.long)
            batch = pack([Sample(**s)], B, 1 << 30, seed=0, epoch=0)
            batch.anchors = a
            batch.labels, batch.valid = block_labels(batch.input_ids, s["loss_mask"].bool(), a, B)
            hidden = model(*batch.drafter_inputs())
            drafts = None
            if model.candidate_selector is not None:  # DFlash2 drafts by the selector walk, 256 blocks at a time
                anchors_tok = batch.input_ids[a]
                drafts = torch.cat([model.propose_batch(hidden[i:i + 256, 1:], anchors_tok[i:i + 256])
                                    for i in range(0, len(a), 256)])
            parts.append(block_metrics(model.logits(hidden[:, 1:]), batch.labels, batch.valid, gamma, drafts))
        model.train()
        return reduce_metrics(parts)

    curve, seconds, first_loss = [], 0.0, None
    for step in range(len(steps) + 1):
        if step in plan["points"]:
            curve.append({"step": step, "train_s": round(seconds, 2), **evaluate()})
            print(f"  {label} step {step}: tau {curve[-1]['tau']:.3f} loss {curve[-1]['loss']:.3f} "
                  f"({seconds:.0f} s)", flush=True)
        if step == len(steps):
            break
        spec = steps[step]
        t0 = time.perf_counter()
        stats = micro_step(model, model, [Sample(**train[i]) for i in spec["samples"]], cfg, spec["epoch"], env.device,
                           1.0, True)
        torch.nn.utils.clip_grad_norm_(params, cfg.training.grad_clip)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, len(steps), cfg)
        opt.step()
        opt.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - t0
        first_loss = float(stats.loss) if first_loss is None else first_loss
    return {"impl": label, "curve": curve, "first_loss": first_loss, "model": model}


def run_speculators_curve(path: Path) -> dict:
    """Runs inside .venv-bench: speculators 0.9.0's DFlashDraftModel and its eager `ce` loss, trained on the same
    packed rows (document ids and per-document positions), the same anchors (its `select_anchors` is handed
    flashdraft's draw), the same labels (its verifier-argmax targets are fed the data's next tokens: the data is
    the target's greedy output, so they are the same tokens) and the same AdamW schedule."""
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from speculators.losses.utils import resolve_loss_config
    from speculators.models.dflash import DFlashDraftModel
    from speculators.models.dflash import core as spec_core
    from speculators.train.cli import create_transformer_layer_config

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    data, plan = load_file(str(path)), json.loads(path.with_suffix(".json").read_text())
    B, gamma, n_train = plan["block_size"], plan["gamma"], plan["n_train"]
    verifier = os.environ["FLASHDRAFT_BENCH_VERIFIER"]
    layer_cfg = create_transformer_layer_config(verifier, num_layers=plan["num_layers"], draft_arch="qwen3",
                                                hidden_act=None, sliding_window=2048,
                                                full_attention_indices=list(range(plan["num_layers"])))
    model = DFlashDraftModel.from_training_args(
        layer_cfg, draft_vocab_size=layer_cfg.vocab_size, block_size=B,
        target_layer_ids=[i + 1 for i in plan["layer_ids"]], verifier_name_or_path=verifier,
        mask_token_id=plan["peer_mask_id"], draft_attn_impl="sdpa").float().train()
    V = layer_cfg.vocab_size

    class NextTokenLogits(torch.nn.Module):  # "verifier logits" whose argmax is the next data token
        def forward(self, x):
            return F.one_hot(x[..., 0].long(), V).float()

    model.verifier_norm = torch.nn.Identity()
    model.verifier_lm_head = NextTokenLogits()
    chosen = {}
    spec_core.select_anchors = lambda loss_mask, n, bs: (chosen["a"], torch.ones_like(chosen["a"], dtype=torch.bool))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=plan["lrs"][0] if plan["lrs"] else 1e-3)
    loss_config = resolve_loss_config("ce", "eager")

    def row(indices: list[int], anchors: list[list[int]]) -> dict:
        ids = [data[f"ids.{i}"] for i in indices]
        nxt = [torch.cat([x[1:], x[-1:]]) for x in ids]
        offs = [0]
        for x in ids:
            offs.append(offs[-1] + x.numel())
        chosen["a"] = torch.tensor([a + offs[j] for j, al in enumerate(anchors) for a in al], dtype=torch.long)
        return {"hidden_states": torch.cat([data[f"feat.{i}"] for i in indices]).float()[None],
                "input_ids": torch.cat(ids)[None],
                "loss_mask": torch.cat([data[f"mask.{i}"] for i in indices]).long()[None],
                "verifier_last_hidden_states": torch.cat(nxt).float()[None, :, None],
                "document_ids": torch.cat([torch.full((x.numel(),), j) for j, x in enumerate(ids)])[None],
                "position_ids": torch.cat([torch.arange(x.numel()) for x in ids])[None],
                "max_anchors": chosen["a"].numel()}

    @torch.no_grad()
    def evaluate() -> dict:
        model.eval()
        parts = []
        for h, anchors in enumerate(plan["held_anchors"]):
            i = n_train + h
            kw = row([i], [anchors])
            _, logits, _, _, _ = model._backbone_forward(**kw)
            a = chosen["a"]
            idx = a[:, None] + torch.arange(1, B)[None, :]
            ids, lm = data[f"ids.{i}"], data[f"mask.{i}"].bool()
            parts.append(block_metrics(logits[0].view(a.numel(), B, -1)[:, 1:], ids[idx], lm[idx], gamma))
        model.train()
        return reduce_metrics(parts)

    curve, seconds, first_loss = [], 0.0, None
    steps = plan["steps"]
    for step in range(len(steps) + 1):
        if step in plan["points"]:
            curve.append({"step": step, "train_s": round(seconds, 2), **evaluate()})
            print(f"  speculators step {step}: tau {curve[-1]['tau']:.3f} loss {curve[-1]['loss']:.3f} "
                  f"({seconds:.0f} s)", file=sys.stderr, flush=True)
        if step == len(steps):
            break
        spec = steps[step]
        t0 = time.perf_counter()
        kw = row(spec["samples"], spec["anchors"])
        _, loss, _ = model(**kw, loss_config=loss_config, gamma=gamma)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, plan["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = plan["lrs"][step]
        opt.step()
        opt.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - t0
        first_loss = float(loss.detach()) if first_loss is None else first_loss
    return {"impl": "speculators 0.9.0", "curve": curve, "first_loss": first_loss}


def load_run_samples(cfg) -> list[dict]:
    """Every committed sample of the run, in sample-id order (the reader's provenance checks apply)."""
    from flashdraft.features.reader import open_reader

    return sorted((vars(s) for s in open_reader(cfg, follow=False)), key=lambda s: str(s["sample_id"]))


def ensure_features(cfg, config: str | None, preset: str, sets: list[str]) -> None:
    """prep -> generate -> extract for the bench's data run; every stage is resumable, so a built run is reused."""
    flags = (["--config", config] if config else []) + ["--preset", preset]
    for s in sets:
        flags += ["--set", s]
    exe = [sys.executable, "-m", "flashdraft.cli.main"]
    subprocess.run(exe + ["prep"] + flags, check=True, stdout=subprocess.DEVNULL)
    for shard in range(cfg.data.num_shards):
        subprocess.run(exe + ["generate", "--shard", str(shard)] + flags, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(exe + ["extract", "--shard", str(shard)] + flags, check=True, stdout=subprocess.DEVNULL)


def with_codec(samples: list[dict], params: dict, num_layers: int) -> list[dict]:
    """The same samples as they would read back from shards of codec `params`: encoded and decoded by the real
    codec."""
    from flashdraft.features.codecs import Codec

    codec = Codec.from_params(params)
    out = []
    for s in samples:
        T, nH = s["features"].shape
        data = codec.encode(s["features"].view(T, num_layers, nH // num_layers))
        out.append({**s, "features": codec.decode(data, T, num_layers, nH // num_layers)})
    return out


def curve_plan(cfg, train: list[dict], held: list[dict], curve_steps: int | None, every: int) -> dict:
    """The steps, anchors and lr schedule of a curve run under `cfg` (its seed decides shuffle and anchors)."""
    from flashdraft.components.train.trainer import lr_at

    plan = build_plan(cfg, train, held, curve_steps or cfg.training.max_steps or 10**9, 1)
    n_steps = len(plan["steps"])
    plan["points"] = curve_points(n_steps, every)
    plan.update(lrs=[lr_at(k, n_steps, cfg) for k in range(n_steps)], grad_clip=cfg.training.grad_clip,
                num_layers=cfg.drafter.num_layers, layer_ids=cfg.layer_ids(30))
    return plan


GATE_DROP = 0.02  # issue 24: a lossy codec's held-out tau within 2% of lossless
# Student's t 97.5% quantiles for 1..10 degrees of freedom (a two-sided 95% interval); beyond 10 the
# Cornish-Fisher expansion around the normal quantile, within 0.1% of the exact value there and closer after.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t975(df: int) -> float:
    """Student's t 97.5% quantile with `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"t975: degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def paired_verdict(diffs: list[float]) -> tuple[float, float, str]:
    """(drop, noise, verdict) of a codec from its per-seed relative tau changes against lossless.

    drop = -mean(diffs); noise = the half-width of the 95% t interval of that mean, t975(n - 1) * sd / sqrt(n).
    Why t and not 2 standard errors: the gate runs 3-5 seeds, where 2 SE claims far more confidence than three
    samples give (t975(2) = 4.3): under 2 SE fp4 e4m3/32 + 8 outliers "passed" on per-seed changes of +1.9%,
    +10.6% and +0.5%, i.e. on noise. Verdict: pass if drop + noise <= 2% (even the interval's worst end is within
    the goal), miss if drop - noise > 2%, else inconclusive. One seed has no noise estimate: inconclusive."""
    drop = -statistics.mean(diffs)
    n = len(diffs)
    noise = t975(n - 1) * statistics.stdev(diffs) / n**0.5 if n > 1 else float("inf")
    verdict = "pass" if drop + noise <= GATE_DROP else "miss" if drop - noise > GATE_DROP else "inconclusive"
    return drop, noise, verdict


def codec_gate(cfg, train: list[dict], held: list[dict], plan: dict, lossless_tau: float, codecs: list[str],
               seeds: int) -> dict:
    """Held-out tau after the same steps, paired by seed: under each of `seeds` training seeds (each its own data
    order, anchors and initial weights) the drafter trains once on lossless features and once on each codec's.

    Why paired: at this data size one seed's tau moves by several percent with any perturbation of the inputs, so
    comparing one codec run with the lossless seeds' spread cannot resolve 2% (the 1200-step gate of stop 27: band
    7.1%, codecs +-5%). Within a seed everything but the features is identical, so the per-seed relative change
    d_s = (tau_codec,s - tau_lossless,s) / tau_lossless,s isolates the codec; `paired_verdict` judges it. The
    lossless seeds' own spread (max - min) / mean is printed for context."""
    from bench_codecs import CANDIDATES, REFERENCES

    known = {**REFERENCES, **CANDIDATES}
    for label in codecs:
        if label not in known:
            raise SystemExit(f"--codecs: unknown {label!r}; choose from {', '.join(known)}")
    n_steps, layers = len(plan["steps"]), len(plan["layer_ids"])
    seeded = []  # (cfg, plan) per seed; seed 0's plan is the caller's
    for extra in range(seeds):
        scfg = cfg.with_overrides({"training.seed": cfg.training.seed + extra}) if extra else cfg
        splan = plan if not extra else curve_plan(scfg, train, held, n_steps, n_steps)
        seeded.append((scfg, {**splan, "points": [n_steps]}))
    taus = [lossless_tau]
    for scfg, splan in seeded[1:]:
        taus.append(run_flashdraft_curve(scfg, train, held, splan,
                                         f"bf16-zstd seed {scfg.training.seed}")["curve"][-1]["tau"])
    mean = statistics.mean(taus)
    band = (max(taus) - min(taus)) / mean
    rows = []
    for label in codecs:
        encoded = with_codec(train, known[label], layers)
        ctaus = [run_flashdraft_curve(scfg, encoded, held, splan, f"{label} seed {scfg.training.seed}")
                 ["curve"][-1]["tau"] for scfg, splan in seeded]
        diffs = [(c - t) / t for c, t in zip(ctaus, taus, strict=True)]
        drop, noise, verdict = paired_verdict(diffs)
        rows.append({"codec": label, "params": known[label], "taus": ctaus, "mean": statistics.mean(ctaus),
                     "diffs": diffs, "drop": drop, "noise": noise, "verdict": verdict})
    print(f"\nCodec quality gate: held-out tau after {n_steps} steps, {seeds} seeds paired (held-out features bf16 "
          f"for every row; load average {os.getloadavg()[0]:.1f})")
    print("| training features | tau per seed | mean | vs lossless, paired mean (95% t interval) "
          "| verdict (goal: within 2%) |")
    print("|---|---|---:|---:|---|")
    print(f"| bf16-zstd (lossless) | {', '.join(f'{t:.3f}' for t in taus)} | {mean:.3f} | seeds' spread "
          f"{100 * band:.1f}% | |")
    for r in rows:
        print(f"| {r['codec']} | {', '.join(f'{t:.3f}' for t in r['taus'])} | {r['mean']:.3f} | "
              f"{-100 * r['drop']:+.1f}% (+-{100 * r['noise']:.1f}%) | {r['verdict']} |")
    return {"lossless": {"taus": taus, "mean": mean, "band": band}, "codecs": rows, "steps": n_steps}


def _acc(c: dict) -> str:
    return " ".join(f"{a:.2f}" for a in c["acc_pos"])


def print_curves(fd: dict, peer: dict | None, load: float) -> dict:
    """Equal steps, then equal wall time (flashdraft's last point reached within the peer's training seconds)."""
    print(f"\nLearning efficiency on identical features, rows and anchors (held-out, load average {load:.1f})")
    head = f"{'step':>5} | {'s':>6} {'loss':>6} {'tau':>5}  acc by slot"
    print(f"{'':>5} | flashdraft" + (" " * 40 + "| speculators 0.9.0" if peer else ""))
    print(head + (" " * 9 + "| " + head[8:] if peer else ""))
    rows = []
    for k, c in enumerate(fd["curve"]):
        line = f"{c['step']:>5} | {c['train_s']:>6.0f} {c['loss']:>6.3f} {c['tau']:>5.2f}  {_acc(c)}"
        row = {"step": c["step"], "flashdraft": c}
        if peer:
            p = peer["curve"][k]
            line += f" | {p['train_s']:>6.0f} {p['loss']:>6.3f} {p['tau']:>5.2f}  {_acc(p)}"
            row["speculators"] = p
        rows.append(row)
        print(line)
    summary = {"equal_steps": rows}
    if peer:
        print("\nEqual wall time (training seconds, evaluation excluded):")
        print(f"{'s':>6} | {'speculators step':>16} {'tau':>5} {'loss':>6} | {'flashdraft step':>15} {'tau':>5} "
              f"{'loss':>6}")
        eq = []
        for p in peer["curve"][1:]:
            reached = [c for c in fd["curve"] if c["train_s"] <= p["train_s"]]
            c = reached[-1]
            print(f"{p['train_s']:>6.0f} | {p['step']:>16} {p['tau']:>5.2f} {p['loss']:>6.3f} | {c['step']:>15} "
                  f"{c['tau']:>5.2f} {c['loss']:>6.3f}")
            eq.append({"train_s": p["train_s"], "speculators": p, "flashdraft": c})
        summary["equal_time"] = eq
        ahead = all(c["flashdraft"]["tau"] >= c["speculators"]["tau"] for c in rows[1:])
        print(f"flashdraft tau >= speculators at every step checkpoint: {ahead}")
    print(f"first training loss: flashdraft {fd['first_loss']:.2f}"
          + (f", speculators {peer['first_loss']:.2f}" if peer else ""))
    return summary


def curve_main(args) -> dict:
    import tempfile

    from flashdraft.config import load_config
    from flashdraft.target.model import cache_dir, resolve_model_dir

    sets = [f"storage.root=file://{cache_dir() / 'bench' / 'runs'}"] if not args.config else []
    sets += args.set or []
    cfg = load_config(args.config, preset=args.preset, overrides=sets)
    ensure_features(cfg, args.config, args.preset, sets)
    samples = load_run_samples(cfg)
    if len(samples) <= args.heldout:
        raise SystemExit(f"{len(samples)} samples: too few for {args.heldout} held-out ones")
    train, held = samples[:-args.heldout], samples[-args.heldout:]
    if args.max_samples:
        train = train[:args.max_samples]
    print(f"curve data: run {cfg.run_id}, {len(train)} train / {len(held)} held-out samples "
          f"({sum(int(s['input_ids'].numel()) for s in train)} train tokens)", flush=True)
    plan = curve_plan(cfg, train, held, args.curve_steps, args.every)
    fd = run_flashdraft_curve(cfg, train, held, plan, "flashdraft")
    peer = None
    if BENCH_PY.is_file() and not args.no_peer:
        from flashdraft.drafter.geometry import resolve_mask_token
        from flashdraft.target.model import load_tokenizer

        plan["peer_mask_id"] = resolve_mask_token(None, load_tokenizer(cfg.target), 49152)[0]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "curve.safetensors"
            write_curve_inputs(path, train, held, plan)
            env = {**os.environ, "OMP_NUM_THREADS": str(THREADS),
                   "FLASHDRAFT_BENCH_VERIFIER": str(resolve_model_dir(cfg.target))}
            proc = subprocess.run([str(BENCH_PY), __file__, "--peer-curve", str(path)], env=env, stdout=subprocess.PIPE,
                                  text=True)
            if proc.returncode != 0:
                raise SystemExit("speculators side failed (see above)")
            peer = json.loads(proc.stdout.strip().splitlines()[-1])
    summary = {"config": cfg.model_dump(mode="json")["training"] | {"drafter": cfg.drafter.model_dump()},
               **print_curves(fd, peer, os.getloadavg()[0])}
    if args.codecs:
        summary["codec"] = codec_gate(cfg, train, held, plan, fd["curve"][-1]["tau"], args.codecs.split(";"),
                                      args.seeds)
    return summary


def step_main(args) -> dict:
    from flashdraft.config import load_config
    from flashdraft.target.model import cache_dir, resolve_model_dir

    batch = cache_dir() / "bench" / f"train-batch-smollm2-{SEQ}.safetensors"
    if not batch.is_file():
        batch.parent.mkdir(parents=True, exist_ok=True)
        print(f"building the benchmark batch (greedy generation + feature capture) -> {batch}", flush=True)
        make_batch(batch)
    results = [bench_flashdraft(batch, args.steps, args.warmup)]
    if BENCH_PY.is_file():
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "FLASHDRAFT_BENCH_VERIFIER": str(
            resolve_model_dir(load_config(preset="smollm2-local").target))}
        proc = subprocess.run([str(BENCH_PY), __file__, "--peer", str(batch), "--steps", str(args.steps),
                               "--warmup", str(args.warmup)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit("speculators side failed (see above)")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    else:
        print(f"{BENCH_PY} missing: run `make bench-venv` for the side-by-side with speculators", file=sys.stderr)
    results.append(bench_flashdraft(batch, args.steps, args.warmup, head_dtype="bfloat16"))
    import torch

    if torch.cuda.is_available():  # GPU: the FlexAttention block mask vs the dense SDPA mask (GPU memory in MB)
        results += [bench_flashdraft(batch, args.steps, args.warmup, "cuda", impl) for impl in ("sdpa", "flex")]

    tokens = SEQ  # sequence tokens per step (the same batch for both)
    print(f"\nDFlash training step, CPU reference geometry: seq {SEQ}, {ANCHORS} anchors, block {BLOCK}, "
          f"1 layer, {THREADS} threads, median of {args.steps}")
    print(f"{'implementation':<28}{'median s/step':>14}{'CPU s/step':>12}{'tokens/s':>10}{'peak MB':>9}"
          f"{'first loss':>12}")
    for r in results:
        r["median_s"] = statistics.median(r["step_s"])
        r["median_cpu_s"] = statistics.median(r["cpu_s"])
        r["tokens_per_s"] = tokens / r["median_s"]
        print(f"{r['impl']:<28}{r['median_s']:>14.3f}{r['median_cpu_s']:>12.3f}{r['tokens_per_s']:>10.0f}"
              f"{r['peak_mb']:>9.0f}{r['first_loss']:>12.3f}")
    summary = {"geometry": {"seq": SEQ, "anchors": ANCHORS, "block": BLOCK, "threads": THREADS},
               "load_avg": os.getloadavg(), "results": results}
    peer = next((r for r in results if r["impl"].startswith("speculators")), None)
    if peer is not None:
        print(f"speedup over speculators (target >= 1.5x), load average {os.getloadavg()[0]:.1f}:")
        for r in results:
            if r is not peer and not r["impl"].startswith("flashdraft cuda"):
                wall, cpu = peer["median_s"] / r["median_s"], peer["median_cpu_s"] / r["median_cpu_s"]
                summary.setdefault("speedup", {})[r["impl"]] = {"wall": wall, "cpu": cpu}
                print(f"  {r['impl']:<26} wall {wall:.2f}x   CPU time {cpu:.2f}x")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["step", "curve", "all"], default="all",
                    help="step: step time/memory; curve: learning curves vs speculators + codec gate")
    ap.add_argument("--steps", type=int, default=12, help="step part: timed steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--preset", default="smollm2-local", help="curve part: the run whose data and recipe are used")
    ap.add_argument("--config", default=None, help="curve part: a run config file over the preset")
    ap.add_argument("--set", action="append", default=None, help="curve part: config overrides (key=value)")
    ap.add_argument("--curve-steps", type=int, default=None, help="curve part: stop after this many steps "
                    "(default: the recipe's epochs)")
    ap.add_argument("--every", type=int, default=20, help="curve part: evaluate every this many steps")
    ap.add_argument("--heldout", type=int, default=12, help="curve part: samples held out (the last by id)")
    ap.add_argument("--max-samples", type=int, default=None, help="curve part: train on the first N samples only")
    ap.add_argument("--no-peer", action="store_true", help="curve part: flashdraft only (recipe search)")
    ap.add_argument("--codecs", default="fp8-zstd;nf4 bf16/64 + 8 outliers;fp4 e4m3/32 + 8 outliers",
                    help="curve part: the codec gate's candidates (';'-separated labels of bench_codecs.py's "
                    "CANDIDATES and fp8/fp8-zstd), each trained on features through that codec; '' skips the gate")
    ap.add_argument("--seeds", type=int, default=3, help="curve part: training seeds of the codec gate (lossless "
                    "and each codec train once per seed, paired; ~5 min a run on 2 cores)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--peer", type=Path, default=None, help=argparse.SUPPRESS)  # internal: run the peer side
    ap.add_argument("--peer-curve", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer is not None:
        print(json.dumps(bench_speculators(args.peer, args.steps, args.warmup)))
        return
    if args.peer_curve is not None:
        print(json.dumps(run_speculators_curve(args.peer_curve)))
        return
    summary = {}
    if args.part in ("step", "all"):
        summary["step"] = step_main(args)
    if args.part in ("curve", "all"):
        summary["curve"] = curve_main(args)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
