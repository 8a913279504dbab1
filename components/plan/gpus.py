"""GPU specifications the planner uses. Data, not code: users override any field with measured numbers through
`plan.gpu_overrides` (e.g. `--set plan.gpu_overrides.b200.bf16_tflops=2000`).

Dense (non-sparse) BF16 tensor throughput, memory and bandwidth from the vendors' public datasheets:
- B200 (HGX, per GPU): 180 GB HBM3e, 7.7-8 TB/s, 2.25 PFLOPS dense BF16 (NVIDIA DGX/HGX B200 datasheet;
  4.5 PFLOPS is the sparse figure).
- RTX PRO 6000 Blackwell Server Edition: 96 GB GDDR7, 1.6 TB/s; ~0.5 PFLOPS dense BF16 (NVIDIA RTX PRO 6000
  Blackwell datasheet quotes FP4/sparse peaks; the dense BF16 figure here is derived from them and marked as such).
- H100 SXM: 80 GB HBM3, 3.35 TB/s, 989 TFLOPS dense BF16 (NVIDIA H100 datasheet).
- H200 SXM: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS dense BF16 (NVIDIA H200 datasheet).
- L40S: 48 GB GDDR6, 864 GB/s, 362 TFLOPS dense BF16 (NVIDIA L40S datasheet; 733 with sparsity).
- A100 SXM 80GB: 80 GB HBM2e, 2.04 TB/s, 312 TFLOPS dense BF16 (NVIDIA A100 datasheet).

Memory the planner checks against (`usable_bytes`): the total the driver reports (`memory_mib`, nvidia-smi's
figure; the datasheets' "GB" of HBM are close to GiB: an H200 "141 GB" reports 143,771 MiB = 140.4 GiB, measured on
the lent H200 of 2026-12-04), minus `RESERVED_GIB` for the CUDA context, NCCL and allocator fragmentation, so an
H200 gives ~138.9 GiB and a B200 (183,359 MiB reported) ~177.6 GiB. Reported totals other than the H200's are
the commonly reported nvidia-smi figures, not measured here; `plan.gpu_overrides.<gpu>.memory_mib` replaces them.
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

    @property
    def usable_bytes(self) -> int:
        """Bytes one process can expect to allocate (module docstring)."""
        total = self.memory_mib * 2**20 if self.memory_mib else self.memory_gb * 2**30
        return int(total - RESERVED_GIB * 2**30)


GPUS: dict[str, GpuSpec] = {
    "b200": GpuSpec("NVIDIA B200", 180, 8000, 2250, "HGX B200 datasheet, dense BF16", 183359),
    "rtx-pro-6000": GpuSpec("NVIDIA RTX PRO 6000 Blackwell Server", 96, 1597, 503.8,
                            "RTX PRO 6000 Blackwell datasheet, dense BF16 derived from sparse peak", 97887),
    "h100": GpuSpec("NVIDIA H100 SXM", 80, 3350, 989, "H100 datasheet, dense BF16", 81559),
    "h200": GpuSpec("NVIDIA H200 SXM", 141, 4800, 989, "H200 datasheet, dense BF16", 143771),
    "l40s": GpuSpec("NVIDIA L40S", 48, 864, 362, "L40S datasheet, dense BF16", 46068),
    "a100": GpuSpec("NVIDIA A100 SXM 80GB", 80, 2039, 312, "A100 datasheet, dense BF16", 81920),
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
