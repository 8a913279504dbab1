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
* Checkpoints: `parts` is the list `torch.distributed.checkpoint.state_dict` takes for several optimizers; its
  state is keyed by parameter name, so a run resumes either optimizer exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim._muon import muon as muon_step

MUON_MOMENTUM = 0.95


class WholeMatrixMuon(torch.optim.Muon):
    """torch.optim.Muon whose DTensor parameters (FSDP2 shards) are updated as whole matrices (module docstring);
    plain tensors take torch's own step unchanged."""

    @torch.no_grad()
    def step(self, closure=None):
        if not any(isinstance(p, DTensor) for g in self.param_groups for p in g["params"]):
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

    def _step_whole(self, p: DTensor, group: dict) -> None:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad)
        buf = state["momentum_buffer"]
        whole_p, whole_buf = p.full_tensor(), buf.full_tensor()
        muon_step([whole_p], [p.grad.full_tensor()], [whole_buf], lr=group["lr"],
                  weight_decay=group["weight_decay"], momentum=group["momentum"], nesterov=group["nesterov"],
                  ns_coefficients=group["ns_coefficients"], eps=group["eps"], ns_steps=group["ns_steps"],
                  adjust_lr_fn=group["adjust_lr_fn"], has_complex=False)
        for shard, whole in ((p, whole_p), (buf, whole_buf)):  # this rank's rows of the updated whole tensors
            shard.to_local().copy_(distribute_tensor(whole, shard.device_mesh, shard.placements,
                                                     src_data_rank=None).to_local())


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
