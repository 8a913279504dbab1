"""GPU specifications the planner uses (`GPUS`): dense BF16 peak, memory and bandwidth from the vendors'
datasheets, plus the total memory the driver reports (`memory_mib`). Data, not code: `plan.gpu_overrides` replaces
any field with a measured number (e.g. `--set plan.gpu_overrides.b200.bf16_tflops=2000`).

Memory the planner checks against (`usable_bytes`) is the reported total minus `RESERVED_GIB` for the CUDA
context, NCCL and allocator fragmentation. Each figure's source, and which were measured: docs/planning.md.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from flashdraft.config import ConfigError

RESERVED_GIB = 1.5  # CUDA context + NCCL + fragmentation: what torch cannot allocate of the reported total


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gb: float
    bandwidth_gbs: float
    bf16_tflops: float
    source: str
    memory_mib: float = 0.0  # total as the driver reports it (0: memory_gb as GiB)
    fp8: bool = True  # FP8 tensor cores (Ada, Hopper, Blackwell): an FP8 target's prefill runs at 2x the BF16 peak

    @property
    def usable_bytes(self) -> int:
        """Bytes one process can expect to allocate: the reported total (`memory_gb` as GiB when `memory_mib` is
        0) minus RESERVED_GIB."""
        total = self.memory_mib * 2**20 if self.memory_mib else self.memory_gb * 2**30
        return int(total - RESERVED_GIB * 2**30)


GPUS: dict[str, GpuSpec] = {
    "b200": GpuSpec("NVIDIA B200", 180, 8000, 2250, "HGX B200 datasheet, dense BF16", 183359),
    "rtx-pro-6000": GpuSpec("NVIDIA RTX PRO 6000 Blackwell Server", 96, 1597, 503.8,
                            "RTX PRO 6000 Blackwell datasheet, dense BF16 derived from sparse peak", 97887),
    "h100": GpuSpec("NVIDIA H100 SXM", 80, 3350, 989, "H100 datasheet, dense BF16", 81559),
    "h200": GpuSpec("NVIDIA H200 SXM", 141, 4800, 989, "H200 datasheet, dense BF16", 143771),
    "l40s": GpuSpec("NVIDIA L40S", 48, 864, 362, "L40S datasheet, dense BF16", 46068),
    "a100": GpuSpec("NVIDIA A100 SXM 80GB", 80, 2039, 312, "A100 datasheet, dense BF16", 81920, fp8=False),
}


def gpu_spec(name: str, overrides: dict[str, dict[str, float]] | None = None) -> GpuSpec:
    if name not in GPUS:
        close = difflib.get_close_matches(name, list(GPUS), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"unknown GPU {name!r}{hint}; known: {', '.join(sorted(GPUS))} (pools.*.gpu_type)")
    spec = GPUS[name]
    fields = (overrides or {}).get(name, {})
    unknown = set(fields) - {"memory_gb", "memory_mib", "bandwidth_gbs", "bf16_tflops"}
    if unknown:
        raise ConfigError(f"plan.gpu_overrides.{name}: unknown fields {sorted(unknown)}")
    if "memory_gb" in fields and "memory_mib" not in fields:
        fields = {**fields, "memory_mib": 0.0}  # a datasheet figure given alone replaces the reported total
    return replace(spec, **fields, source=spec.source + (" (overridden)" if fields else ""))
