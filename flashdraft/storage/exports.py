"""An export folder's commit record (`export/<format>.manifest.json`) and the names it may hold: the contract
between the export stage (components/export/export.py writes both) and its readers (`download_export`, a
`drafter.init_from` store URI naming a run's `export/<format>/`).

Format names come from listed keys and file names from the manifest, both written by whoever can write the store,
so a reader accepts only a safe single path component (`safe_name`) before it touches anything local."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from flashdraft.storage import layout
from flashdraft.storage.store import NotCommittedError, ObjectStore, StoreError

_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


class UnsafeNameError(StoreError):
    """A name read from the store is not one plain file or folder name; the message names it and where it came
    from."""


class ExportFile(BaseModel):
    sha256: str = Field(description="content checksum")
    size: int = Field(description="bytes")


class ExportManifest(BaseModel):
    """The commit record of one export folder (`export/<format>.manifest.json`)."""

    format: str = Field(description="zlab or speculators")
    files: dict[str, ExportFile] = Field(description="file name in the folder -> its checksum and size")


def safe_name(name: str, where: str) -> str:
    """`name` when it is one plain path component (letters, digits, `._-`, not starting with a dot: no `..`, no
    `/`, nothing empty or hidden), else UnsafeNameError naming it and `where` it was read."""
    if not _SAFE_NAME.fullmatch(name):
        raise UnsafeNameError(f"{where}: refusing the name {name!r}: not a plain file or folder name (letters, "
                              "digits, '.', '_', '-'; no '/', no leading '.')")
    return name


def read_manifest(store: ObjectStore, fmt: str) -> ExportManifest | None:
    """The committed manifest of `export/<fmt>/` (verified against its commit record, every file name checked
    with `safe_name`), None when none is committed."""
    key = layout.export_manifest_key(fmt)
    try:
        manifest = ExportManifest.model_validate(store.get_json_verified(key))
    except NotCommittedError:
        return None
    for name in manifest.files:
        safe_name(name, store.url(key))
    return manifest


def read_export_file(store: ObjectStore, fmt: str, name: str, manifest: ExportManifest) -> bytes:
    """File `name` of `export/<fmt>/`, checked against its sha256 in the manifest (ChecksumError names both)."""
    rec = manifest.files[name]
    return store.get_expected(layout.export_prefix(fmt) + name, rec.sha256, rec.size, layout.export_manifest_key(fmt))
