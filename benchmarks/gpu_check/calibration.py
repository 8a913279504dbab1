"""The calibration file (flashdraft/perf/calibration.py) of what section 5 measured: the production step's best fitting
rate and every configuration's peak, and the extraction prefill rate; `flashdraft plan --calibrate` reads it."""

from __future__ import annotations

import datetime

import torch

from flashdraft.perf.calibration import Calibration
from gpu_check.production import Production, StepParts
from gpu_check.sections import peak_tflops


def _memory_row(r: StepParts, shape) -> dict:
    return {"peak_bytes": r.peak_bytes, "measure": "cuda_max_allocated", "out_of_memory": bool(r.oom),
            "note": r.label + (f": {r.oom}" if r.oom else ""),
            "shape": shape.model_copy(update={"anchors_per_row": r.anchors_per_row or None,
                                              "activation_checkpointing": r.recompute})}


def calibration(prod: Production, device: str, commit: str | None) -> Calibration:
    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name() if cuda else "cpu (dry run)"
    peak = peak_tflops(name) if cuda else None
    best = max((r for r in prod.train if not r.oom), key=lambda r: r.tokens_per_s, default=None)
    rates: dict = {}
    if best is not None:
        rates["train"] = {"tokens_per_s_per_gpu": best.tokens_per_s, "flops_per_token": prod.flops_per_token,
                          "note": f"{best.label}; step {best.step_s * 1e3:.0f} ms",
                          "shape": prod.shape.model_copy(update={"anchors_per_row": best.anchors_per_row,
                                                                 "activation_checkpointing": best.recompute})}
    if prod.extract_tokens_per_s:
        rates["extract"] = {"tokens_per_s_per_gpu": prod.extract_tokens_per_s,
                            "note": "HF prefill with capture hooks (the extract stage's hf backend), random weights",
                            "shape": {"model": f"Qwen3.6-27B architecture, random weights, "
                                               f"{max(prod.extract_layers) + 1} layers",
                                      "layers_run": max(prod.extract_layers) + 1, "hidden_size": prod.extract_hidden,
                                      "forward_tokens": prod.extract_forward_tokens,
                                      "dtype": "bfloat16" if cuda else "float32"}}
    dflash2 = prod.shape.model_copy(update={"kind": "dflash2"})
    memory = [_memory_row(r, prod.shape) for r in prod.train if cuda]
    memory += [_memory_row(r, dflash2) for r in prod.dflash2 if cuda]
    return Calibration.model_validate({
        "source": {"device": f"one {name}", "date": datetime.date.today().isoformat(),
                   "commit": commit, "command": "make gpu-check",
                   "note": "one GPU, no FSDP: the fp32 weights, gradients and AdamW state of the trainable "
                           "drafter are whole on the GPU and in every peak"},
        "gpu": {"name": name, "gpu_type": peak[0] if peak else None,
                "memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
                "bf16_tflops_peak": peak[1] if peak else None},
        "rates": rates, "train_memory": memory})
