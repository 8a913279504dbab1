"""Measured figures that replace the planner's assumptions: the calibration file.

`benchmarks/gpu_check` (`make gpu-check`, `make gpu-e2e`) writes one on a real GPU; a user may write one from
their own cluster's measurements. `flashdraft plan --calibrate FILE` reads it: a measured stage rate replaces the
assumed one, a measured trainer peak corrects the memory model, and the plan names the `source` of each figure.

Why rates come with their shape: a rate holds only at the shape it was measured at (anchors a sample and tokens a
step change the drafted positions per data token several-fold). With `flops_per_token` (the model FLOPs of one
data token at that shape) a rate becomes a fraction of the GPU's dense bf16 peak, and a generate rate with
`bytes_per_token` a fraction of its memory bandwidth; that fraction carries to another shape or GPU. Without
either a rate is used as it is, only on the same GPU type (docs/planning.md).

JSON, one object, `schema_version` 1; unknown keys are an error (a misspelt field must not silently do nothing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 1
STAGES = ("generate", "extract", "train")


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CalibrationSource(_Strict):
    """Where the figures come from: enough to find the run again."""

    device: str = Field(description="the machine in words, e.g. 'one NVIDIA H200 SXM (lent device)'")
    date: str = Field(description="ISO date (or date-time) of the measurement")
    commit: str | None = Field(None, description="flashdraft git commit the measurement ran at")
    command: str | None = Field(None, description="the command that produced it, e.g. 'make gpu-check'")
    note: str | None = Field(None, description="anything a reader needs: caveats, what was not measured")


class GpuInfo(_Strict):
    """The accelerator the figures were measured on."""

    name: str = Field(description="as the driver reports it, e.g. 'NVIDIA H200'")
    gpu_type: str | None = Field(None, description="planner GPU key (components/plan/gpus.py), e.g. h200; rates "
                                                   "apply unchanged only to pools of this type")
    memory_bytes: int | None = Field(None, ge=1, description="total device memory as the driver reports it")
    bf16_tflops_peak: float | None = Field(None, gt=0, description="dense bf16 datasheet peak used for efficiency")
    bf16_matmul_tflops: float | None = Field(None, gt=0, description="a measured large bf16 matmul, for reference")
    memory_bandwidth_gbs: float | None = Field(None, gt=0, description="memory bandwidth (GB/s) a generate rate "
                                               "with bytes_per_token is a fraction of (default: the planner's "
                                               "figure for gpu_type)")


class TrainShape(_Strict):
    """The trainer step a rate or a peak was measured at (drafter geometry and per-GPU batch)."""

    hidden_size: int = Field(ge=1)
    num_layers: int = Field(ge=1, description="draft layers")
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1, description="rows of the LM head the loss scores (the draft vocabulary if reduced)")
    target_vocab_size: int | None = Field(None, ge=1, description="rows of the frozen embedding (default vocab_size)")
    num_features: int = Field(5, ge=1, description="target layers fused into the context")
    block_size: int = Field(ge=2)
    max_anchors: int = Field(ge=1, description="anchors a sample (drafter.max_anchors)")
    tokens_per_step: int = Field(ge=1, description="tokens in one packed row (training.tokens_per_step)")
    anchors_per_row: float | None = Field(None, ge=0, description="anchors actually drawn per row (measured mean)")
    sliding_window: int | None = Field(None, ge=1)
    strategy: Literal["none", "ddp", "fsdp2"] = Field("none", description="none: one process, no wrapper")
    world_size: int = Field(1, ge=1, description="ranks the state is sharded over (fsdp2)")
    autocast: Literal["bfloat16", "none"] = "bfloat16"
    head_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    activation_checkpointing: Literal["none", "mlp", "layer"] = Field(
        "none", description="training.activation_checkpointing: what the layers recompute in the backward")
    kind: Literal["dflash", "dflash2"] = Field(
        "dflash", description="drafter.kind; dflash2 adds block convolutions and the candidate selector "
                              "(the four fields below; ignored for dflash)")
    conv_kernel_size: int = Field(2, ge=1, description="dflash2: drafter.conv_kernel_size (taps along the block)")
    conv_group_size: int = Field(64, ge=1, description="dflash2: drafter.conv_group_size (channels sharing a delta)")
    selector_rank: int = Field(256, ge=1, description="dflash2: drafter.selector_rank (codebook width)")
    selector_top_k: int = Field(16, ge=1, description="dflash2: drafter.selector_top_k (LM-head candidates a slot)")
    selector_detach: bool = Field(False, description="dflash2: drafter.selector_detach (the selector loss keeps no "
                                                     "gathered LM-head rows for the backward)")
    optimizer: Literal["adamw", "muon"] = Field("adamw", description="training.optimizer: muon keeps one fp32 "
                                                "buffer per hidden-matrix parameter, AdamW two per parameter")


class ExtractShape(_Strict):
    """The extraction forward a rate was measured at."""

    model: str = Field(description="the target (or its stand-in) that ran, e.g. '8 layers of Qwen3-8B'")
    layers_run: int = Field(ge=1, description="decoder layers the forward ran (up to the deepest feature layer)")
    hidden_size: int = Field(ge=1)
    forward_tokens: int = Field(ge=1, description="padded tokens per forward")
    dtype: str = "bfloat16"


class GenerateShape(_Strict):
    """The generation run a rate was measured at."""

    model: str
    batch: int = Field(ge=1, description="concurrent sequences")
    max_model_len: int | None = Field(None, ge=1)
    dtype: str = "bfloat16"


class _Rate(_Strict):
    tokens_per_s_per_gpu: float = Field(gt=0, description="data tokens a second on one GPU")
    flops_per_token: float | None = Field(None, gt=0, description="model FLOPs of one data token at this shape; "
                                                                  "lets the planner carry the rate to other shapes")
    note: str | None = None


class TrainRate(_Rate):
    shape: TrainShape


class ExtractRate(_Rate):
    shape: ExtractShape


class GenerateRate(_Rate):
    """Decoding is bound by reading the weights once a step for the whole batch, so with `bytes_per_token` (weight
    bytes a step / sequences in the batch) the planner turns the rate into a fraction of the GPU's memory
    bandwidth, which carries to another GPU, batch and target as the planner's own decode model does."""

    shape: GenerateShape
    bytes_per_token: float | None = Field(None, gt=0, description="weight bytes read per generated token: the "
                                          "weights one decode step reads over the concurrent sequences")


class StageRates(_Strict):
    generate: GenerateRate | None = None
    extract: ExtractRate | None = None
    train: TrainRate | None = None


class TrainMemory(_Strict):
    """One measured trainer peak."""

    peak_bytes: int = Field(ge=0, description="peak bytes on one GPU over a few steps")
    measure: Literal["cuda_max_allocated", "cuda_max_reserved", "rss_delta"] = Field(
        "cuda_max_allocated", description="what peak_bytes is: torch.cuda.max_memory_allocated (tensors), "
        "max_memory_reserved (the allocator's segments) or a CPU process's peak RSS over its baseline")
    shape: TrainShape
    out_of_memory: bool = Field(False, description="the step failed: peak_bytes is a lower bound")
    predicted_bytes: int | None = Field(None, ge=0, description="what the planner predicted then (for the record)")
    note: str | None = None


class Calibration(_Strict):
    """A calibration file: measured rates per stage and trainer peaks, with where they come from."""

    schema_version: Literal[1] = SCHEMA_VERSION
    source: CalibrationSource
    gpu: GpuInfo
    rates: StageRates = Field(default_factory=StageRates)
    train_memory: list[TrainMemory] = Field(default_factory=list)

    def origin(self) -> str:
        """One line naming the source, for the plan's 'measured' notes."""
        s = self.source
        bits = [self.gpu.name, s.date] + ([f"commit {s.commit}"] if s.commit else [])
        return f"{s.device} ({', '.join(bits)})"


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; errors name the file and the field."""
    p = Path(path)
    if not p.is_file():
        raise CalibrationError(f"calibration file not found: {p}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"calibration file {p}: invalid JSON: {exc}") from None
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise CalibrationError(f"calibration file {p}: {fields}") from None


def save_calibration(cal: Calibration, path: str | Path) -> Path:
    """Write `cal` as indented JSON, atomically (a crash never leaves half a file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(cal.model_dump_json(indent=2, exclude_none=True) + "\n")
    os.replace(tmp, p)
    return p
