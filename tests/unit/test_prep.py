"""Prep end to end on local files with the real tokenizer: quarantine counts, survivors, shards, errors, reruns."""

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flashdraft.components.prep.formats import BAD_REASONS, content_key, normalize_row
from flashdraft.components.prep.prep import run_prep
from flashdraft.components.prep.sources import SourceError
from flashdraft.config import load_config
from flashdraft.run.records import PROMPT_SCHEMA, parquet_bytes_to_table
from flashdraft.storage import layout
from flashdraft.storage.store import open_store

GOOD = [
    {"messages": [{"role": "user", "content": "Name three primary colours."}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]},
    {"conversations": [{"from": "human", "value": "Write a haiku about rain."}, {"from": "gpt", "value": "..."}]},
    {"instruction": "Sort these numbers", "input": "3, 1, 2", "output": "1, 2, 3"},
    {"prompt": "Explain recursion in one sentence."},
]
# (raw JSONL line, reason) for every kind of bad row
BAD = [
    (b'{"prompt": "unterminated"', "invalid_json"),
    (b"[1, 2, 3]", "invalid_json"),
    (b'{"prompt": "caf\xe9 au lait"}', "undecodable_bytes"),
    (b'{"text": "no recognised field"}', "unknown_format"),
    (b'{"messages": [{"content": "who am I?"}]}', "missing_role"),
    (b'{"messages": [{"role": "narrator", "content": "Once upon a time"}]}', "unknown_role"),
    (b'{"messages": [{"role": "user", "content": "   "}]}', "empty_content"),
    (b'{"messages": [{"role": "user", "content": {"text": "hi"}}]}', "non_string_content"),
    (b'{"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}', "wrong_role_order"),
    (b'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}', "wrong_role_order"),
    (json.dumps({"prompt": "word " * 400}).encode(), "too_long"),
]


def _cfg(tmp_path, sources, **over):
    overrides = {"storage.root": f"file://{tmp_path}/runs", "data.sources": sources, "data.max_samples": None,
                 "data.eval_count": 1, "data.num_shards": 2, "data.max_prompt_tokens": 96, **over}
    return load_config(preset="tiny", overrides=overrides)


def _all_prompt_rows(cfg, summary):
    store = open_store(cfg.storage, cfg.run_id)
    rows = []
    for key in summary.shard_keys + [summary.eval_key]:
        rows += parquet_bytes_to_table(store.get_verified(key), PROMPT_SCHEMA).to_pylist()
    return rows


def test_every_bad_row_is_quarantined_with_its_reason_and_every_good_row_survives(tmp_path):
    lines = [json.dumps(GOOD[0]).encode(), BAD[0][0], json.dumps(GOOD[1]).encode()]
    lines += [b for b, _ in BAD[1:]] + [json.dumps(g).encode() for g in GOOD[2:]]
    lines += [json.dumps(GOOD[0]).encode(), b""]  # an exact duplicate and a blank line
    src = tmp_path / "mixed.jsonl"
    src.write_bytes(b"\n".join(lines))
    cfg = _cfg(tmp_path, [{"uri": str(src)}])

    summary = run_prep(cfg)

    expected = {reason: sum(r == reason for _, r in BAD) for reason in BAD_REASONS}
    assert summary.bad_rows == expected
    assert summary.quarantined == len(BAD)
    assert summary.duplicates == 1
    assert summary.kept == len(GOOD)
    assert summary.num_train + summary.num_eval == len(GOOD)
    survivors = {r["sample_id"] for r in _all_prompt_rows(cfg, summary)}
    assert survivors == {content_key(normalize_row(g)[0]) for g in GOOD}

    store = open_store(cfg.storage, cfg.run_id)
    entries = [json.loads(x) for x in store.get_verified(layout.PROMPTS_QUARANTINE).decode().splitlines()]
    line_of = {b: n for n, b in enumerate(lines, start=1)}
    assert sorted((e["row"], e["reason"]) for e in entries) == sorted((line_of[b], r) for b, r in BAD)
    assert all(e["source"] == str(src) and e["detail"] for e in entries)
    assert "| &nbsp;&nbsp;too_long | 1 |" in summary.markdown


def test_json_and_parquet_sources_and_their_bad_rows(tmp_path):
    js = tmp_path / "rows.json"
    js.write_text(json.dumps({"data": [GOOD[3], {"instruction": 7}]}))
    pqf = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"prompt": pa.array([b"Describe a cloud.", b"bad \xff bytes"], pa.binary())}), pqf)
    cfg = _cfg(tmp_path, [{"uri": str(js)}, {"uri": f"file://{pqf}", "format": "prompt"}], **{"data.eval_count": 0})
    summary = run_prep(cfg)
    assert summary.bad_rows["non_string_content"] == 1
    assert summary.bad_rows["undecodable_bytes"] == 1
    assert summary.sources[str(js)] == {"read": 2, "kept": 1, "non_string_content": 1}
    texts = {json.loads(r["messages"])[0]["content"] for r in _all_prompt_rows(cfg, summary)}
    assert texts == {"Sort these numbers\n\n3, 1, 2", "Describe a cloud."}


def test_demo_prep_shards_split_and_manifest(tiny_cfg):
    cfg = tiny_cfg.with_overrides({"data.num_shards": 3, "data.max_samples": 50, "data.eval_count": 5})
    summary = run_prep(cfg)
    assert summary.num_shards == 3 and summary.num_eval == 5 and summary.num_train == 45
    assert summary.shard_rows == [15, 15, 15]
    rows = _all_prompt_rows(cfg, summary)
    assert len({r["sample_id"] for r in rows}) == 50
    assert all(0 < r["prompt_tokens"] <= cfg.data.max_prompt_tokens for r in rows)
    manifest = open_store(cfg.storage, cfg.run_id).get_json_verified(layout.PROMPTS_MANIFEST)
    assert set(manifest["summary"]) >= {"tokenizer_sha", "chat_template_sha", "prompt_tokens", "sources"}
    assert manifest["summary"]["sources"] == {"builtin:demo": {"read": 302, "kept": 302}}


def test_a_train_only_source_is_never_held_out_and_the_other_sources_split_as_before(tiny_cfg):
    base = tiny_cfg.with_overrides({"data.max_samples": None, "data.eval_count": 12, "data.num_shards": 1})
    chat = run_prep(base)
    both = base.with_overrides({"run_id": "both", "data.sources": [
        {"uri": "builtin:demo"}, {"uri": "builtin:demo-code", "heldout": False}]})
    summary = run_prep(both)
    store = open_store(both.storage, both.run_id)
    eval_rows = parquet_bytes_to_table(store.get_verified(layout.EVAL_PROMPTS), PROMPT_SCHEMA).to_pylist()
    train_rows = parquet_bytes_to_table(store.get_verified(layout.prompt_shard_key(0)), PROMPT_SCHEMA).to_pylist()
    code = summary.sources["builtin:demo-code"]["kept"]
    assert code > 0 and summary.num_eval == 12 and summary.num_train == chat.num_train + code
    assert {r["source"] for r in eval_rows} == {"builtin:demo"}
    assert sum(r["source"] == "builtin:demo-code" for r in train_rows) == code
    # held out by default: the same two sources without the flag put code prompts in the eval split
    mixed = run_prep(both.with_overrides({"run_id": "mixed", "data.sources": [
        {"uri": "builtin:demo"}, {"uri": "builtin:demo-code"}]}))
    mixed_eval = parquet_bytes_to_table(open_store(both.storage, "mixed").get_verified(layout.EVAL_PROMPTS),
                                        PROMPT_SCHEMA).to_pylist()
    assert mixed.num_eval == 12 and "builtin:demo-code" in {r["source"] for r in mixed_eval}


def test_shuffle_is_deterministic_and_rerun_is_reused_but_changed_config_is_refused(tmp_path):
    from flashdraft.run.runner import StageInputsChanged, run_task

    a = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/a"})
    b = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/b"})
    sa, sb = run_task(a, "prep"), run_prep(b)
    ids = [[r["sample_id"] for r in _all_prompt_rows(c, s)] for c, s in ((a, sa), (b, sb))]
    assert ids[0] == ids[1]
    c = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/c", "data.seed": 1})
    assert [r["sample_id"] for r in _all_prompt_rows(c, run_prep(c))] != ids[0]

    assert run_task(a, "prep").skipped is True
    with pytest.raises(StageInputsChanged, match=r"^prep: .*data.max_prompt_tokens \d+ -> 100; .*--from prep"):
        run_task(a.with_overrides({"data.max_prompt_tokens": 100}), "prep")
    # a field that cannot change the prompts does not count
    assert run_task(a.with_overrides({"data.expected_samples": 5000}), "prep").skipped is True


def test_unreadable_or_empty_sources_are_clear_errors(tmp_path):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"definitely not parquet")
    all_bad = tmp_path / "bad.jsonl"
    all_bad.write_bytes(b"{oops\n[]\n")
    cases = [(str(tmp_path / "missing.jsonl"), "file not found"), (str(broken), "not a readable Parquet"),
             (str(all_bad), "zero valid rows"), (str(tmp_path / "x.csv"), "unknown file type"),
             ("builtin:nope", "the builtin sources are builtin:demo, builtin:demo-code")]
    for uri, message in cases:
        with pytest.raises(SourceError, match=message):
            run_prep(_cfg(tmp_path, [{"uri": uri}]))


def test_a_file_source_rewritten_in_place_is_not_reused(tmp_path):
    """Issue 57: prep's fingerprint holds each file source's sha256, so the same URI with other bytes is a changed
    input (refused naming the digests), not "reused: fingerprint matches"; a record made before flashdraft
    resolved sources (no such field) is not refused for it."""
    from flashdraft.run import status
    from flashdraft.run.runner import StageInputsChanged, run_task

    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"Say {w} twice."}) + "\n" for w in "abcdefghij"))
    cfg = _cfg(tmp_path, [{"uri": str(source)}]).with_overrides({"data.eval_count": 2, "data.num_shards": 1})
    run_task(cfg, "prep")
    store = open_store(cfg.storage, cfg.run_id)
    record = status.read_record(store, "prep")
    assert record.inputs["data.sources@resolved"] == [
        {"uri": str(source), "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}]
    assert run_task(cfg, "prep").skipped is True
    source.write_text(source.read_text().replace("Say j", "Say k"))
    with pytest.raises(StageInputsChanged, match=r"^prep: .*data.sources@resolved\[0\].sha256 .*--from prep"):
        run_task(cfg, "prep")
    legacy = record.model_copy(update={"inputs": {k: v for k, v in record.inputs.items() if "@" not in k}})
    store.commit_json(status.status_key("prep"), legacy.model_dump(mode="json"))
    assert run_task(cfg, "prep").skipped is True
