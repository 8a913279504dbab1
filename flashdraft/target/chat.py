"""Chat-template rendering at the token level, shared by prep (length filter) and generate (prompts, records).

Generated replies must enter later turns as the exact token ids the target produced (re-tokenizing decoded text
may not round-trip). So a conversation is rendered with a unique sentinel in place of each generated reply, the
text is split at the sentinels, each piece is tokenized, and the generated ids are spliced in between. The end
of turn token that the template writes after a reply is the target's own stop token, so it is marked as
generated too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_SENTINEL = "\u2063FDREPLY{}\u2063"


@dataclass
class Reply:
    ids: list[int]          # generated token ids, including the stop token when it stopped
    stopped: bool           # ended on a stop token (vs the length limit)


def render(tok, messages: list[dict[str, str]], add_generation_prompt: bool,
           template_kwargs: dict[str, Any] | None = None) -> str:
    """The chat template as text; `template_kwargs` is `data.chat_template_kwargs` (e.g. enable_thinking)."""
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                   **(template_kwargs or {}))


def encode(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def prompt_token_count(tok, messages: list[dict[str, str]], regenerate_turns: list[int],
                       template_kwargs: dict[str, Any] | None = None) -> int:
    """Tokens the target reads before its last reply, with earlier replies still empty: the length-filter
    measure of a prompt (for one turn it is exactly the generation prompt)."""
    return len(encode(tok, render(tok, messages[: regenerate_turns[-1]], True, template_kwargs)))


def build_turn(tok, messages: list[dict[str, str]], turn: int, replies: dict[int, Reply],
               template_kwargs: dict[str, Any] | None = None) -> tuple[list[int], list[int]]:
    """Token ids (and loss mask) of the generation prompt for assistant turn `turn`, with the target's earlier
    replies (`replies`, keyed by message index) spliced in as their exact ids."""
    conv = [dict(m) for m in messages[:turn]]
    for idx in replies:
        conv[idx]["content"] = _SENTINEL.format(idx)
    text = render(tok, conv, True, template_kwargs)
    ids: list[int] = []
    mask: list[int] = []
    stop_pending: int | None = None  # the previous reply's stop token, expected to open the next text piece
    for idx in sorted(replies):
        before, _, text = text.partition(_SENTINEL.format(idx))
        _append_text(tok, before, ids, mask, stop_pending)
        reply = replies[idx]
        body = reply.ids[:-1] if reply.stopped else reply.ids
        ids.extend(body)
        mask.extend([1] * len(body))
        stop_pending = reply.ids[-1] if reply.stopped else None
    _append_text(tok, text, ids, mask, stop_pending)
    return ids, mask


def _append_text(tok, text: str, ids: list[int], mask: list[int], stop_pending: int | None) -> None:
    piece = encode(tok, text)
    ids.extend(piece)
    mask.extend([0] * len(piece))
    if stop_pending is not None and piece and piece[0] == stop_pending:
        # The template closes the reply with its end-of-turn token: the token the target itself generated.
        mask[len(mask) - len(piece)] = 1


def end_of_turn_id(tok, template_kwargs: dict[str, Any] | None = None) -> int | None:
    """The token the chat template writes right after an assistant reply (`<|im_end|>`, `<|eot_id|>`): the stop
    token the target generates to end a turn. None when the template writes plain text there."""
    text = render(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL.format(0)}],
                  False, template_kwargs)
    after = encode(tok, text.partition(_SENTINEL.format(0))[2])
    return after[0] if after and after[0] in set(tok.all_special_ids) else None


def written_sample(tok, messages: list[dict[str, str]], turns: list[int], end_of_turn: int | None,
                   template_kwargs: dict[str, Any] | None = None) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of a conversation whose assistant turns `turns` hold written replies (the dataset's
    own, data.responses=dataset), laid out exactly as generate lays out the target's: each reply's tokens and the
    end-of-turn token after it (`end_of_turn_id`) are masked 1, and the sequence ends with the last reply's."""
    replies = {t: Reply(ids=encode(tok, messages[t]["content"]) + ([end_of_turn] if end_of_turn is not None else []),
                        stopped=end_of_turn is not None) for t in turns}
    final = replies.pop(turns[-1])
    ids, mask = build_turn(tok, messages, turns[-1], replies, template_kwargs)
    return ids + final.ids, mask + [1] * len(final.ids)
