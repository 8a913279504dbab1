"""data.responses=dataset: prep writes the rows' own assistant turns as the run's responses, token for token as the
chat template lays the whole conversation out, masked as generated turns are; reply-less rows are quarantined."""

import json

import pytest

from flashdraft.components.prep.formats import BadRow, normalize_row
from flashdraft.components.prep.prep import run_prep
from flashdraft.config import load_config
from flashdraft.run.records import PROMPT_SCHEMA, RESPONSE_SCHEMA, iter_responses, parquet_bytes_to_table
from flashdraft.storage import layout
from flashdraft.storage.store import open_store
from flashdraft.target.chat import encode, end_of_turn_id, render
from flashdraft.target.model import load_tokenizer

# One row per format, each with its full conversation as the chat template should see it.
ROWS = [
    ({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                   {"role": "assistant", "content": "It is 4."}, {"role": "user", "content": "And 3+3?"},
                   {"role": "assistant", "content": "Six, clearly."}]}, "messages"),
    ({"conversations": [{"from": "human", "value": "Write a haiku about rain."},
                        {"from": "gpt", "value": "Grey sky, soft drumming,\nroofs hum."},
                        {"from": "human", "value": "Now one about sun."},
                        {"from": "gpt", "value": "Warm light on the stones."}]}, "sharegpt"),
    ({"instruction": "Sort these numbers", "input": "3, 1, 2", "output": "1, 2, 3"}, "alpaca"),
    ({"messages": [{"role": "user", "content": "Name a fruit."},
                   {"role": "assistant", "content": "A pear."}]}, "messages"),
]
# Rows with no reply to train on: each quarantined as no_reply.
REPLYLESS = [
    {"messages": [{"role": "user", "content": "Hello?"}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"},
                  {"role": "user", "content": "Bye?"}]},
    {"conversations": [{"from": "human", "value": "Anyone?"}, {"from": "gpt", "value": "  "}]},
    {"instruction": "Say nothing"},
    {"prompt": "Just a prompt."},
]


def _conversation(row: dict) -> list[dict[str, str]]:
    """The row's turns as chat messages, by hand (not through prep's reader)."""
    if "messages" in row:
        return row["messages"]
    if "conversations" in row:
        return [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]}
                for t in row["conversations"]]
    return [{"role": "user", "content": f"{row['instruction']}\n\n{row['input']}"},
            {"role": "assistant", "content": row["output"]}]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(load_config(preset="tiny").target)


def _prep(tmp_path, rows, **over):
    src = tmp_path / "conversations.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(preset="tiny", overrides={
        "storage.root": f"file://{tmp_path}/runs", "data.sources": [{"uri": str(src)}], "data.max_samples": None,
        "data.eval_count": 0, "data.num_shards": 1, "data.responses": "dataset", **over})
    return cfg, run_prep(cfg)


def _spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    spans: list[list[int]] = []
    for i, (t, m) in enumerate(zip(ids, mask, strict=True)):
        if m:
            if i == 0 or not mask[i - 1]:
                spans.append([])
            spans[-1].append(t)
    return spans


def test_each_formats_assistant_turns_become_responses_token_for_token(tmp_path, tok):
    cfg, summary = _prep(tmp_path, [r for r, _ in ROWS])
    assert summary.responses == "dataset" and summary.quarantined == 0
    store = open_store(cfg.storage, cfg.run_id)
    records = {r["sample_id"]: r for r in iter_responses(store, 0)}
    prompts = parquet_bytes_to_table(store.get_verified(layout.prompt_shard_key(0)), PROMPT_SCHEMA).to_pylist()
    assert len(records) == len(ROWS) == len(prompts)
    eot = end_of_turn_id(tok)
    assert eot == tok.convert_tokens_to_ids("<|im_end|>")
    by_first_user = {next(m["content"] for m in json.loads(p["messages"]) if m["role"] == "user"): p
                     for p in prompts}
    for row, fmt in ROWS:
        conv = _conversation(row)
        first_user = next(m["content"] for m in conv if m["role"] == "user")
        record = records[by_first_user[first_user]["sample_id"]]
        ids, mask = record["input_ids"], record["loss_mask"]
        # the whole conversation through the chat template, up to the last reply's end-of-turn token
        full = encode(tok, render(tok, conv, add_generation_prompt=False))
        assert ids == full[:len(ids)], fmt
        assert ids[-1] == eot and tok.decode(full[len(ids):]).strip() == "", fmt
        # every assistant turn, each with its end-of-turn token, and nothing else is masked
        replies = [m["content"] for m in conv if m["role"] == "assistant"]
        assert [tok.decode(s) for s in _spans(ids, mask)] == [r + "<|im_end|>" for r in replies], fmt
        assert record["prompt_len"] == mask.index(1) and record["response_text"] == replies[-1]
        assert record["finish_reason"] == "stop"
    done = store.get_json_verified(layout.responses_done_key(0))
    assert done["responses"] == "dataset" and done["samples"] == len(ROWS)
    assert done["turns"] == 6 and done["reply_tokens"] == summary.reply_tokens == sum(
        sum(r["loss_mask"]) for r in records.values())


def test_reply_less_rows_are_quarantined_with_their_reason_and_counted(tmp_path):
    rows = [r for r, _ in ROWS] + REPLYLESS
    cfg, summary = _prep(tmp_path, rows)
    assert summary.bad_rows["no_reply"] == len(REPLYLESS) == summary.quarantined
    assert summary.kept == len(ROWS)
    store = open_store(cfg.storage, cfg.run_id)
    entries = [json.loads(x) for x in store.get_verified(layout.PROMPTS_QUARANTINE).decode().splitlines()]
    assert sorted(e["row"] for e in entries) == list(range(len(ROWS) + 1, len(rows) + 1))
    assert all(e["reason"] == "no_reply" and "assistant" in e["detail"] for e in entries)
    assert "| &nbsp;&nbsp;no_reply | 5 |" in summary.markdown


def test_a_reply_longer_than_max_response_tokens_is_too_long(tmp_path):
    long = {"messages": [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "one " * 60}]}
    _, summary = _prep(tmp_path, [r for r, _ in ROWS] + [long], **{"data.max_response_tokens": 32})
    assert summary.bad_rows["too_long"] == 1 and summary.kept == len(ROWS)


def test_eval_split_stays_prompts_for_the_target(tmp_path):
    cfg, summary = _prep(tmp_path, [r for r, _ in ROWS], **{"data.eval_count": 2})
    store = open_store(cfg.storage, cfg.run_id)
    evals = parquet_bytes_to_table(store.get_verified(layout.EVAL_PROMPTS), PROMPT_SCHEMA).to_pylist()
    assert len(evals) == 2
    for row in evals:
        messages = json.loads(row["messages"])
        assert all(messages[t]["role"] == "assistant" and messages[t]["content"] == ""
                   for t in row["regenerate_turns"])
    held_out = {r["sample_id"] for r in evals}
    trained = {r["sample_id"] for r in iter_responses(store, 0)}
    assert not held_out & trained and len(trained) == len(ROWS) - 2
    assert set(RESPONSE_SCHEMA.names) <= set(next(iter_responses(store, 0)))


def test_target_mode_still_clears_the_replies():
    messages, turns = normalize_row(ROWS[0][0])
    assert [messages[t]["content"] for t in turns] == ["", ""]
    kept, _ = normalize_row(ROWS[0][0], keep_replies=True)
    assert [kept[t]["content"] for t in turns] == ["It is 4.", "Six, clearly."]
    with pytest.raises(BadRow, match="no_reply"):
        normalize_row(REPLYLESS[0], keep_replies=True)
