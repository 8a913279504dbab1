"""Every recognised row format normalises to the same chat form; malformed rows raise the right reason."""

import pytest

from flashdraft.components.prep.formats import BadRow, content_key, normalize_row

ASSISTANT = {"role": "assistant", "content": ""}


@pytest.mark.parametrize("row, fmt, expected", [
    ({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]}, "messages",
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}, ASSISTANT]),
    ({"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello"}]}, "sharegpt",
     [{"role": "user", "content": "Hi?"}, ASSISTANT]),
    ({"instruction": "Translate", "input": "chat", "output": "cat"}, "alpaca",
     [{"role": "user", "content": "Translate\n\nchat"}, ASSISTANT]),
    ({"instruction": "Tell a joke", "input": "", "output": "..."}, "alpaca",
     [{"role": "user", "content": "Tell a joke"}, ASSISTANT]),
    ({"prompt": "Why is the sky blue?"}, "prompt", [{"role": "user", "content": "Why is the sky blue?"}, ASSISTANT]),
    ({"prompt": "Q", "system": "S"}, "prompt", [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                                                ASSISTANT]),
])
@pytest.mark.parametrize("declared", ["auto", "explicit"])
def test_each_format_normalises(row, fmt, expected, declared):
    messages, regen = normalize_row(row, "auto" if declared == "auto" else fmt)
    assert messages == expected
    assert regen == [len(expected) - 1]


def test_multi_turn_keeps_user_turns_and_regenerates_every_assistant_turn():
    row = {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "a"},
                             {"from": "gpt", "value": "original answer"}, {"from": "human", "value": "b"}]}
    messages, regen = normalize_row(row)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert regen == [2, 4]
    assert all(messages[i]["content"] == "" for i in regen)  # the target writes these itself


@pytest.mark.parametrize("row, reason", [
    ([1, 2], "invalid_json"),
    ({"text": "no known field"}, "unknown_format"),
    ({"messages": [{"content": "hi"}]}, "missing_role"),
    ({"messages": [{"role": "narrator", "content": "hi"}]}, "unknown_role"),
    ({"conversations": [{"from": "alien", "value": "hi"}]}, "unknown_role"),
    ({"messages": [{"role": "user", "content": "  \n"}]}, "empty_content"),
    ({"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "x"}]}, "empty_content"),
    ({"messages": [{"role": "user", "content": ["a", "b"]}]}, "non_string_content"),
    ({"prompt": 42}, "non_string_content"),
    ({"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}, "wrong_role_order"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "wrong_role_order"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}, "wrong_role_order"),
    ({"messages": [{"role": "system", "content": "only a system turn"}]}, "wrong_role_order"),
])
def test_malformed_rows_raise_their_reason(row, reason):
    with pytest.raises(BadRow) as err:
        normalize_row(row)
    assert err.value.reason == reason


def test_content_key_ignores_whitespace_but_not_words_or_roles():
    a = [{"role": "user", "content": "Hello   world\n"}]
    assert content_key(a) == content_key([{"role": "user", "content": "Hello world"}])
    assert content_key(a) != content_key([{"role": "user", "content": "Hello there"}])
    assert content_key(a) != content_key([{"role": "system", "content": "Hello world"}])
