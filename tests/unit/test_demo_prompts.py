"""builtin:demo is varied, deterministic and valid in every row."""

import json
from collections import Counter

from flashdraft.components.prep.demo import GENERATORS, demo_rows
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
