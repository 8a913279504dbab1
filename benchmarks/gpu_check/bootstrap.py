"""What a bare GPU machine lacks: the device image has PyTorch and transformers but not what flashdraft imports
(pydantic and its helpers, zstandard), nor transformers at the version flashdraft is tested with (the image's 5.17
still names the decoder cache `past_key_values`, which the evaluate stage's `cache=` calls would silently bypass).
Those travel as wheels in benchmarks/gpu_wheels/ (`make gpu-wheels`; ignored by git, carried to the machine). Only
the standard library here: this runs before anything it makes importable."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / "benchmarks" / "gpu_wheels"


def carried_wheels(wheels: Path = WHEELS, label: str = "gpu-check") -> Path | None:
    """Unpack every carried wheel whose distribution is missing here or at another version into a fresh folder
    put first on sys.path; returns that folder (None when nothing was needed). `make gpu-e2e` reuses it and also
    hands the folder to its subprocesses (PYTHONPATH)."""
    wanted = []
    for wheel in sorted(wheels.glob("*.whl")):
        dist, version = wheel.name.split("-")[:2]
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wanted.append(wheel)
    if not wanted:
        return None
    site = Path(tempfile.mkdtemp(prefix=f"{label}-wheels-"))
    for wheel in wanted:
        zipfile.ZipFile(wheel).extractall(site)
    sys.path.insert(0, str(site))
    print(f"{label}: using carried {', '.join(w.name.split('-')[0] for w in wanted)}", file=sys.stderr)
    return site


def bootstrap() -> None:
    """Make the repository importable as installed (flashdraft, flashdraft.components) with the carried wheels."""
    for folder in (REPO, REPO / "benchmarks"):  # flashdraft itself; bench_codecs (section 6)
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    carried_wheels()
    if importlib.util.find_spec("pydantic") is None:
        raise SystemExit(f"gpu-check: pydantic is not installed and {WHEELS} has no wheels: run `make gpu-wheels` "
                         "on a machine with network access and carry benchmarks/gpu_wheels")
    try:
        import flashdraft.components  # noqa: F401  (installed: package-dir maps it to components/)
    except ImportError:
        import flashdraft

        spec = importlib.util.spec_from_file_location("flashdraft.components", REPO / "components" / "__init__.py",
                                                      submodule_search_locations=[str(REPO / "components")])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["flashdraft.components"] = mod
        spec.loader.exec_module(mod)
        flashdraft.components = mod
