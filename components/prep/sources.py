"""Read raw prompt rows from a source: a local path or object-store URI (JSONL, JSON, Parquet), `hf:<id>` (its
config, split(s) and revision: flashdraft/storage/hub_datasets.py), or `builtin:demo`.

Each reader yields `(row_number, row)` with 1-based row numbers (JSONL: the line number) so quarantine entries
point at the exact line. A row that cannot even be decoded is yielded as a `BadRow` instead of a dict. A file
that cannot be read at all raises `SourceError` naming it.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flashdraft.config import SourceSpec, StorageConfig
from flashdraft.config.features import split_uri
from flashdraft.storage import hub_datasets as hub
from flashdraft.storage.store import ObjectStore

from .demo import code_completion_rows, demo_rows
from .formats import BadRow

# The prompt sets the package writes itself (demo.py): offline, deterministic.
BUILTIN_SOURCES = {"builtin:demo": demo_rows, "builtin:demo-code": code_completion_rows}

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}


class SourceError(RuntimeError):
    """A source that cannot be used at all (unreadable, unknown type, no valid rows)."""


def _file_kind(uri: str) -> str:
    suffix = Path(uri.split("?", 1)[0]).suffix.lower()
    if suffix not in SUFFIXES:
        raise SourceError(f"source {uri}: unknown file type {suffix!r}; use .jsonl, .json or .parquet")
    return SUFFIXES[suffix]


def read_bytes(uri: str, storage: StorageConfig) -> bytes:
    """The bytes of a local path or `file://`, `s3://`, `memory://` URI (S3 endpoint from storage config)."""
    try:
        if "://" not in uri:
            return Path(uri).expanduser().read_bytes()
        parent, _, name = uri.rstrip("/").rpartition("/")
        scheme, _ = split_uri(uri)
        sub = StorageConfig(root=parent, endpoint_url=storage.endpoint_url, region=storage.region,
                            path_style=storage.path_style) if scheme == "s3" else None
        return ObjectStore(parent, sub).get(name)
    except FileNotFoundError:
        raise SourceError(f"source {uri}: file not found") from None
    except OSError as exc:
        raise SourceError(f"source {uri}: cannot read: {exc}") from None


def _decode_bytes(value: Any) -> Any:
    """Parquet binary columns arrive as bytes: decode them as UTF-8 or flag the row."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRow("undecodable_bytes", f"not UTF-8 at byte {exc.start}") from None
    if isinstance(value, dict):
        return {k: _decode_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_bytes(v) for v in value]
    return value


def _jsonl_rows(data: bytes) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, BadRow("undecodable_bytes", f"not UTF-8 at byte {exc.start}")
            continue
        try:
            yield number, json.loads(text)
        except json.JSONDecodeError as exc:
            yield number, BadRow("invalid_json", f"{exc.msg} at column {exc.colno}")


def _json_rows(uri: str, data: bytes) -> Iterator[tuple[int, Any]]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"source {uri}: not a readable JSON document: {exc}") from None
    if isinstance(doc, dict):
        doc = next((doc[k] for k in ("data", "rows", "examples") if isinstance(doc.get(k), list)), None)
    if not isinstance(doc, list):
        raise SourceError(f"source {uri}: a .json source must be a list of rows (or an object with a 'data' list)")
    yield from enumerate(doc, start=1)


def _parquet_rows(uri: str, data: bytes) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise SourceError(f"source {uri}: not a readable Parquet file: {exc}") from None
    for number, row in enumerate(table.to_pylist(), start=1):
        try:
            yield number, _decode_bytes(row)
        except BadRow as bad:
            yield number, bad


def _hf_rows(spec: SourceSpec) -> Iterator[tuple[int, Any]]:
    """The rows of the source's splits in order, numbered on across them (the quarantine's row numbers)."""
    try:
        import datasets  # noqa: F401 (a package dependency; an image without it says so here)
    except ImportError:
        raise SourceError(f"source {spec.uri}: reading a Hub dataset needs the `datasets` package "
                          "(a flashdraft dependency: reinstall flashdraft)") from None
    try:
        yield from enumerate(hub.iter_rows(spec, spec.uri), start=1)
    except hub.HubError as exc:
        raise SourceError(f"source {spec.uri} {_selection(spec)}: {exc}") from None


def _selection(spec: SourceSpec) -> str:
    """config / splits / revision of an hf: source, as the config names them."""
    parts = ([f"config {spec.config}"] if spec.config else []) + [f"split {','.join(spec.split_names)}"]
    return "(" + ", ".join(parts + ([f"revision {spec.revision}"] if spec.revision else [])) + ")"


def source_identity(spec: SourceSpec, storage: StorageConfig) -> dict[str, str]:
    """What this source's URI names now, beside the URI itself: an hf: dataset's commit sha, a file's sha256 (a
    builtin set is part of flashdraft: nothing). Prep's fingerprint holds it, so a source changed under the same
    URI is not reused."""
    if spec.uri.startswith("hf:"):
        try:
            return {"uri": spec.uri, "commit": hub.resolve_commit(spec.uri, spec.revision)}
        except hub.HubError as exc:
            raise SourceError(f"source {spec.uri} {_selection(spec)}: {exc}") from None
    if spec.uri.startswith("builtin:"):
        return {"uri": spec.uri}
    return {"uri": spec.uri, "sha256": hashlib.sha256(read_bytes(spec.uri, storage)).hexdigest()}


def iter_source(spec: SourceSpec, storage: StorageConfig) -> Iterator[tuple[int, Any]]:
    """`(row_number, raw row or BadRow)` for every row of one source."""
    if spec.uri in BUILTIN_SOURCES:
        yield from enumerate(BUILTIN_SOURCES[spec.uri](), start=1)
        return
    if spec.uri.startswith("builtin:"):
        raise SourceError(f"source {spec.uri}: the builtin sources are {', '.join(BUILTIN_SOURCES)}")
    if spec.uri.startswith("hf:"):
        yield from _hf_rows(spec)
        return
    kind = _file_kind(spec.uri)
    data = read_bytes(spec.uri, storage)
    if kind == "jsonl":
        yield from _jsonl_rows(data)
    elif kind == "json":
        yield from _json_rows(spec.uri, data)
    else:
        yield from _parquet_rows(spec.uri, data)
