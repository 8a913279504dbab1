"""Token-level chat rendering: the target's replies enter later turns as their exact ids, and the loss mask marks
exactly the tokens the target generated (its stop token included)."""

import pytest

from flashdraft.config import load_config
from flashdraft.target.chat import Reply, build_turn, encode, prompt_token_count, render
from flashdraft.target.model import load_tokenizer

CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": ""}, {"role": "user", "content": "And a colour?"},
        {"role": "assistant", "content": ""}]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(load_config(preset="tiny").target)


def test_first_turn_is_the_plain_templated_prompt(tok):
    ids, mask = build_turn(tok, CONV, 2, {})
    assert ids == encode(tok, render(tok, CONV[:2], add_generation_prompt=True))
    assert not any(mask)


@pytest.mark.parametrize("stopped", [True, False])
def test_later_turn_splices_reply_ids_and_masks_them(tok, stopped):
    # Odd ids a tokenizer would never produce for this text: they can only come from the splice.
    body = [tok.convert_tokens_to_ids("Ġbanana"), 17, 4242]
    reply = Reply(ids=body + [tok.eos_token_id] if stopped else body, stopped=stopped)
    ids, mask = build_turn(tok, CONV, 4, {2: reply})
    first, _ = build_turn(tok, CONV, 2, {})
    n = len(first)
    assert ids[:n] == first  # turn 2 extends exactly what turn 1 saw
    assert ids[n:n + len(body)] == body
    marked = [i for i, m in enumerate(mask) if m]
    if stopped:  # the template's end-of-turn token is the target's own stop token
        assert ids[n + len(body)] == tok.eos_token_id
        assert marked == list(range(n, n + len(body) + 1))
    else:
        assert marked == list(range(n, n + len(body)))
    assert tok.decode(ids[n + len(body):]).strip().endswith("assistant")
    assert "And a colour?" in tok.decode(ids[n:])


def test_prompt_token_count_measures_up_to_the_last_turn(tok):
    single = CONV[:2] + [{"role": "assistant", "content": ""}]
    assert prompt_token_count(tok, single, [2]) == len(build_turn(tok, single, 2, {})[0])
    assert prompt_token_count(tok, CONV, [2, 4]) > prompt_token_count(tok, single, [2])


def test_chat_template_kwargs_reach_the_template():
    tok = load_tokenizer(load_config(preset="tiny").target)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% if enable_thinking is false %}<no-think>"
                         "{% endif %}{% endif %}")
    plain = build_turn(tok, CONV, 2, {})[0]
    no_think = build_turn(tok, CONV, 2, {}, {"enable_thinking": False})[0]
    assert tok.decode(no_think).endswith("<assistant><no-think>") and not tok.decode(plain).endswith("<no-think>")
    assert prompt_token_count(tok, CONV, [2], {"enable_thinking": False}) == len(no_think)
