"""The trainer's optimizers (`training.optimizer`): AdamW on everything, or Muon on the hidden matrices and AdamW on
the rest, stepped together behind one object.

* Muon (`torch.optim.Muon`, torch >= 2.9) orthogonalises each 2-D update with Newton-Schulz iterations, which only
  means something for a matrix that maps one activation space to another: the weights of the drafter's Linear
  layers. Vectors (norms, the trainable mask embedding), 3-D tensors (DFlash2's base kernels) and lookup tables
  (DFlash2's codebooks: rows are tokens, not a linear map) stay on AdamW; the embedding and LM head are frozen.
* One lr for both: `adjust_lr_fn="match_rms_adamw"` scales each matrix's update to the RMS an AdamW update has
  (0.2 sqrt(max(rows, cols)); Moonshot's rule, the speculators default), so `training.lr`, its warmup and cosine
  serve both and `training.muon_lr_scale` (default 1) is the only knob between them.
* Under FSDP2 the parameters are DTensor shards. torch's Muon accepts them, but its Newton-Schulz then runs as
  DTensor ops whose bf16 partial products are reduced across ranks: measured on 2 gloo ranks, one matrix's first
  update differed from the unsharded one by 16% of its size. `WholeMatrixMuon` instead gathers each matrix (its
  weights, gradient and momentum), runs torch's own Muon step on the whole tensors and keeps this rank's rows:
  the unsharded update exactly, one matrix's gather at a time (tests/integration/test_muon_fsdp2.py).
* Newton-Schulz precision: torch runs the iteration in bf16, right on a GPU. A CPU without native bf16 matmuls
  (AVX2, or AVX-512 without AMX/BF16) runs them ~45x slower than fp32 (AMD EPYC, AVX2, one thread: a 576 x 1536
  matrix's Gram product and the product after it, 1.84 s in bf16 against 0.040 s in fp32), which made one
  `smollm2-local` Muon step last about a minute. On CPU the same quintic iteration runs in fp32
  (`newton_schulz`): a slightly more exact orthogonalisation at fp32 speed; CUDA takes torch's own bf16 step.
* Checkpoints: `parts` is the list `torch.distributed.checkpoint.state_dict` takes for several optimizers; its
  state is keyed by parameter name, so a run resumes either optimizer exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim._muon import _adjust_lr as muon_lr
from torch.optim._muon import muon as muon_step

MUON_MOMENTUM = 0.95


class WholeMatrixMuon(torch.optim.Muon):
    """torch.optim.Muon whose DTensor parameters (FSDP2 shards) are updated as whole matrices, and whose
    Newton-Schulz runs in fp32 on CPU (module docstring); CUDA tensors take torch's own step unchanged."""

    @torch.no_grad()
    def step(self, closure=None):
        whole = any(isinstance(p, DTensor) or p.device.type == "cpu" for g in self.param_groups for p in g["params"])
        if not whole:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step_whole(p, group)
        return loss

    def _step_whole(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad)
        buf = state["momentum_buffer"]
        sharded = isinstance(p, DTensor)
        whole_p, whole_buf = (p.full_tensor(), buf.full_tensor()) if sharded else (p, buf)
        grad = p.grad.full_tensor() if sharded else p.grad
        if whole_p.device.type == "cpu":
            _cpu_muon_step(whole_p, grad, whole_buf, group)
        else:
            muon_step([whole_p], [grad], [whole_buf], lr=group["lr"], weight_decay=group["weight_decay"],
                      momentum=group["momentum"], nesterov=group["nesterov"],
                      ns_coefficients=group["ns_coefficients"], eps=group["eps"], ns_steps=group["ns_steps"],
                      adjust_lr_fn=group["adjust_lr_fn"], has_complex=False)
        if sharded:  # this rank's rows of the updated whole tensors
            for shard, full in ((p, whole_p), (buf, whole_buf)):
                shard.to_local().copy_(distribute_tensor(full, shard.device_mesh, shard.placements,
                                                         src_data_rank=None).to_local())


def newton_schulz(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> torch.Tensor:
    """torch.optim.Muon's quintic Newton-Schulz orthogonalisation of the 2-D `g`, in fp32 (torch's runs in bf16)."""
    a, b, c = coefficients
    x = g.float()
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def _cpu_muon_step(p: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor, group: dict) -> None:
    """One Muon update of `p`, torch's single-tensor step with the Newton-Schulz in fp32."""
    buf.lerp_(grad, 1 - group["momentum"])
    update = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
    update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"]).to(p.dtype)
    p.mul_(1 - group["lr"] * group["weight_decay"])
    p.add_(update, alpha=-muon_lr(group["lr"], group["adjust_lr_fn"], p.shape))


def muon_matrices(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trainable 2-D weights of `model`'s Linear layers with both sides wider than 1 (Muon's parameters)."""
    return [m.weight for m in model.modules()
            if isinstance(m, torch.nn.Linear) and m.weight.requires_grad and min(m.weight.shape) > 1]


@dataclass
class Optimizers:
    """One or two optimizers stepped as one: `parts[i]` runs at the scheduled lr times `scales[i]`."""

    parts: list[torch.optim.Optimizer]
    scales: list[float]

    def set_lr(self, lr: float) -> None:
        for opt, scale in zip(self.parts, self.scales, strict=True):
            for g in opt.param_groups:
                g["lr"] = lr * scale

    def step(self) -> None:
        for opt in self.parts:
            opt.step()

    def zero_grad(self) -> None:
        for opt in self.parts:
            opt.zero_grad(set_to_none=True)


def build_optimizers(model: torch.nn.Module, params: list[torch.nn.Parameter], kind: str, lr: float,
                     weight_decay: float, muon_lr_scale: float = 1.0) -> Optimizers:
    """AdamW over `params` (the trainable parameters), or (kind "muon") Muon over `muon_matrices(model)` and AdamW
    over the others. `model` is the unwrapped drafter, whose modules hold the parameters the wrapper trains."""
    if kind == "adamw":
        return Optimizers([torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)], [1.0])
    if kind != "muon":
        raise ValueError(f"training.optimizer={kind!r}: use 'adamw' or 'muon'")
    matrices = {id(p) for p in muon_matrices(model)}
    muon = [p for p in params if id(p) in matrices]
    rest = [p for p in params if id(p) not in matrices]
    parts = [WholeMatrixMuon(muon, lr=lr * muon_lr_scale, weight_decay=weight_decay, momentum=MUON_MOMENTUM,
                              nesterov=True, adjust_lr_fn="match_rms_adamw")]
    scales = [muon_lr_scale]
    if rest:
        parts.append(torch.optim.AdamW(rest, lr=lr, weight_decay=weight_decay))
        scales.append(1.0)
    return Optimizers(parts, scales)
