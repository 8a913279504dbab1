"""Row schemas shared between stages, stored as Parquet: prompts (prep -> generate) and responses
(generate -> extract/evaluate).

A schema here is the contract between a producer and its consumers; both sides import it, so a column rename
cannot silently break the next stage.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore

# One prompt: the conversation so far (system/user turns, plus earlier assistant turns that are regenerated
# turn by turn), as JSON-encoded chat messages.
PROMPT_SCHEMA = pa.schema([
    ("sample_id", pa.string()),        # stable id: hash of the normalised content
    ("messages", pa.string()),         # JSON list of {role, content}
    ("regenerate_turns", pa.list_(pa.int32())),  # indices of assistant turns the target regenerates
    ("source", pa.string()),           # source file/URI
    ("source_row", pa.int64()),
    ("prompt_tokens", pa.int32()),
])

# One generated sample: prompt + target response as token ids, with the loss mask over response tokens.
RESPONSE_SCHEMA = pa.schema([
    ("sample_id", pa.string()),
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.uint8())),   # 1 on tokens the target generated (assistant turns)
    ("prompt_len", pa.int32()),            # tokens before the first generated token
    ("response_text", pa.string()),
    ("finish_reason", pa.string()),        # stop | length | empty
])


def table_to_parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def parquet_bytes_to_table(data: bytes, schema: pa.Schema | None = None) -> pa.Table:
    table = pq.read_table(io.BytesIO(data))
    if schema is not None:
        missing = [f.name for f in schema if f.name not in table.column_names]
        if missing:
            raise ValueError(f"parquet data lacks columns {missing} required by the schema")
        table = table.select(schema.names).cast(schema)
    return table


def rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def response_chunk_keys(store: ObjectStore, shard: int) -> list[str]:
    """Committed response chunks of one generation shard, in order."""
    prefix = layout.responses_shard_prefix(shard)
    return [k for k in store.list_committed(prefix) if k.endswith(".parquet")]


def iter_responses(store: ObjectStore, shard: int) -> Iterator[dict[str, Any]]:
    """Every committed response row of a generation shard (checksums verified)."""
    for key in response_chunk_keys(store, shard):
        table = parquet_bytes_to_table(store.get_verified(key), RESPONSE_SCHEMA)
        yield from table.to_pylist()
