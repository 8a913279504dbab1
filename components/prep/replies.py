"""data.responses=dataset: the rows' own assistant turns become the run's responses, written by prep in the layout
generate writes (responses/shard-K/chunk-00000.parquet, then responses/shard-K/DONE; RESPONSE_SCHEMA), so extract,
train, evaluate and export read them unchanged and the run has no generate task.

Each reply is tokenized on its own and spliced into the chat template as generate splices the target's replies
(flashdraft/target/chat.py `written_sample`): every assistant turn is conditioned on the dataset's own earlier
turns and masked, with the template's end-of-turn token after it, as a generated turn is. What is traded: the
drafter learns replies the target did not write (docs/training.md, "Training on the dataset's replies").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from flashdraft.run.records import RESPONSE_SCHEMA, rows_to_table, table_to_parquet_bytes
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore
from flashdraft.target.chat import encode, end_of_turn_id, written_sample

from .formats import BadRow

SOURCE = "dataset"  # the DONE record's `responses`: where the replies came from


def check_reply_lengths(tok, messages: list[dict[str, str]], turns: list[int], limit: int) -> None:
    """Quarantine (too_long) a row with a reply longer than data.max_response_tokens, the bound generate holds the
    target to: with max_prompt_tokens it bounds the sequences extraction sees."""
    for t in turns:
        n = len(encode(tok, messages[t]["content"]))
        if n > limit:
            raise BadRow("too_long", f"reply in turn {t} has {n} tokens > data.max_response_tokens={limit}")


@dataclass(frozen=True)
class ShardReplies:
    """One shard's DONE record in dataset mode (the counts a generate DONE has, less what only generation has)."""

    shard: int
    num_chunks: int
    samples: int
    turns: int
    reply_tokens: int
    responses: str = SOURCE


def response_record(tok, row: dict, messages: list[dict[str, str]], end_of_turn: int | None,
                    template_kwargs: dict | None) -> dict:
    """One RESPONSE_SCHEMA row from a kept prompt row whose assistant turns hold the dataset's replies."""
    turns = list(row["regenerate_turns"])
    ids, mask = written_sample(tok, messages, turns, end_of_turn, template_kwargs)
    return {"sample_id": row["sample_id"], "input_ids": ids, "loss_mask": mask, "prompt_len": mask.index(1),
            "response_text": messages[turns[-1]]["content"], "finish_reason": "stop"}


def write_dataset_responses(store: ObjectStore, tok, shards: list[list[dict]],
                            template_kwargs: dict | None) -> list[ShardReplies]:
    """Commit each train shard's responses as one chunk, then its DONE record (last, as generate does)."""
    end_of_turn = end_of_turn_id(tok, template_kwargs)
    done = []
    for shard, rows in enumerate(shards):
        records = [response_record(tok, r, json.loads(r["messages"]), end_of_turn, template_kwargs) for r in rows]
        reply_tokens = sum(sum(r["loss_mask"]) for r in records)
        store.commit(layout.response_chunk_key(shard, 0), table_to_parquet_bytes(rows_to_table(records,
                     RESPONSE_SCHEMA)), {"samples": len(records), "responses": SOURCE})
        record = ShardReplies(shard=shard, num_chunks=1, samples=len(records),
                              turns=sum(len(r["regenerate_turns"]) for r in rows), reply_tokens=reply_tokens)
        store.commit_json(layout.responses_done_key(shard), asdict(record))
        done.append(record)
    return done
