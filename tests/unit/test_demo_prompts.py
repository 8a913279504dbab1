"""builtin:demo is varied, deterministic and valid in every row."""

import json
from collections import Counter

from flashdraft.components.prep.demo import GENERATORS, code_completion_rows, demo_rows
from flashdraft.components.prep.formats import normalize_row


def test_demo_set_is_large_varied_and_deterministic():
    rows = demo_rows()
    distinct = {json.dumps(r["messages"], sort_keys=True) for r in rows}
    assert len(distinct) == len(rows) >= 300
    counts = Counter(r["category"] for r in rows)
    assert set(counts) == set(GENERATORS)
    assert min(counts.values()) >= 15
    assert json.dumps(rows) == json.dumps(demo_rows())
    # any prefix (max_rows) still mixes categories
    assert len({r["category"] for r in rows[:len(GENERATORS)]}) == len(GENERATORS)


def test_every_demo_row_normalises_and_multi_turn_rows_regenerate_several_turns():
    multi = 0
    for row in demo_rows():
        _, regen = normalize_row(row)
        multi += len(regen) > 1
    assert multi >= 30


def test_demo_code_rows_are_distinct_function_stubs_that_normalise_to_one_request():
    from flashdraft.components.prep.sources import iter_source
    from flashdraft.config import SourceSpec, StorageConfig

    rows = [row for _, row in iter_source(SourceSpec(uri="builtin:demo-code"), StorageConfig())]
    assert rows == code_completion_rows() and len(rows) >= 50
    requests = [r["messages"][0]["content"] for r in rows]
    assert len(set(requests)) == len(rows)
    for row, text in zip(rows, requests, strict=True):
        stub = text.split("\n\n", 1)[1]
        assert stub.startswith("def ") and '"""' in stub and ">>> " in stub
        compile(stub + "    pass\n", "<stub>", "exec")  # every stub is valid Python once given a body
        messages, regen = normalize_row(row)
        assert [m["role"] for m in messages] == ["user", "assistant"] and len(regen) == 1
