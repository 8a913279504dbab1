"""The plan gate's free-space check: a `file://` store whose filesystem cannot hold the planned bytes at rest.

Without it a run pointed at a too-small disk passed the gate and failed at extract, after generation's GPU-hours
were spent (issue 48: a tiny run planned at 5.8 MB at rest on a 2 MB filesystem). An object store (`s3://`) has no
free space to read, and `memory://` none that matters: only `file://` is checked. Feature bytes the run already
stored count as held (a resumed extract needs only the rest), so a rerun after a full disk passes once the space
is there.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from flashdraft.config import RunConfig
from flashdraft.config.features import split_uri
from flashdraft.storage import layout


@dataclass(frozen=True)
class FreeSpace:
    """What the filesystem under a run's `file://` folder holds and has left."""

    path: str  # the run folder, or its nearest existing parent (what disk_usage measured)
    free_bytes: int  # free to this process (shutil.disk_usage's `free`)
    stored_bytes: int  # feature bytes the run already holds there (a resumed run needs only the rest)


def _nearest_existing(path: Path) -> Path:
    """`path` or its nearest existing parent (a run's folder is made by its first write)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _bytes_under(path: Path) -> int:
    """Bytes of every file under `path` (0 when it does not exist)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def free_space(cfg: RunConfig) -> FreeSpace | None:
    """The run folder's free space and stored feature bytes; None for a store that is not `file://`."""
    scheme, root = split_uri(cfg.storage.root)
    if scheme != "file":
        return None
    run_dir = Path(root) / cfg.run_id if cfg.run_id else Path(root)
    measured = _nearest_existing(run_dir.absolute())
    return FreeSpace(str(measured), shutil.disk_usage(measured).free, _bytes_under(run_dir / layout.FEATURES))


def _size(n: int) -> str:
    """Bytes in decimal units with the exact count beside them (a 2 MB disk and a 16 TB plan both read well)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit} ({n:,} B)"
    return f"{n:,} B"


def space_gate(planned_bytes: int, space: FreeSpace | None, what: str) -> str | None:
    """Why the run may not start for lack of disk, in one line naming both numbers and the path; None when the
    planned bytes (less those already stored) fit the free space, or the store is not a filesystem."""
    if space is None:
        return None
    needed = max(0, planned_bytes - space.stored_bytes)
    if needed <= space.free_bytes:
        return None
    held = f", {_size(space.stored_bytes)} of it already stored," if space.stored_bytes else ""
    return (f"the plan needs {_size(planned_bytes)} {what}{held} but the filesystem of {space.path} has "
            f"{_size(space.free_bytes)} free: free space there or point storage.root at a larger filesystem")
