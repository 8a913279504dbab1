"""What export adds to the run report: where the drafter is (the export folders and the newest checkpoint)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashdraft.run.reporting import RunView, StageReport
from flashdraft.storage import layout

if TYPE_CHECKING:
    from flashdraft.components.export.summary import ExportSummary
    from flashdraft.storage.store import ObjectStore


def drafter_uris(store: ObjectStore) -> list[str]:
    """Exported drafter folders (export/<format>/, each committed by its manifest) and the newest checkpoint."""
    folders = set()
    for key in store.list_committed(layout.EXPORT + "/"):
        fmt = layout.export_format_of(key)
        if fmt is not None:
            folders.add(layout.export_prefix(fmt))
        elif key.count("/") >= 2:  # a run exported by an older flashdraft: a record beside every file
            folders.add(key.rsplit("/", 1)[0] + "/")
    uris = [store.url(f) for f in sorted(folders)]
    ckpts = sorted({k.rsplit("/", 1)[0] for k in store.list_committed(layout.CHECKPOINTS + "/")})
    if ckpts:
        uris.append(store.url(ckpts[-1]))
    return uris


def report(_: ExportSummary | None, run: RunView) -> StageReport:
    uris = drafter_uris(run.store)
    return StageReport(sections=[("Drafter", [[u] for u in uris] if uris else run.absent("export"))])
