"""Read back a W&B offline run file (`run-<id>.wandb`) in tests: W&B writes a LevelDB-style record log (a 7-byte
`:W&B` header, then 32 KiB blocks of records, each a 7-byte header of crc32, length and type FULL/FIRST/MIDDLE/LAST)
of `wandb_internal_pb2.Record` messages. Its Python reader left the package when the Go core replaced it."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pos, parts = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:
            break
        if pos + HEADER + length > len(data):  # the writer is mid-record: read what is whole
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def finished(path: Path) -> bool:
    """Whether the run's exit record is written: W&B's core process writes the file after `finish()` returns."""
    return any(r.WhichOneof("record_type") == "exit" for r in records(path))


def history(path: Path) -> list[dict[str, Any]]:
    """Each logged row as {key: value}."""
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records(path) if r.WhichOneof("record_type") == "history"]


def config(path: Path) -> dict[str, Any]:
    """The run config as logged (the run record's, then any later updates)."""
    out: dict[str, Any] = {}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        updates = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        out.update({item.key: json.loads(item.value_json) for item in updates})
    return out
