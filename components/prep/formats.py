"""Normalise one raw prompt row (messages / ShareGPT / Alpaca / plain prompt) to chat messages.

The normal form is `[system?] user, assistant, user, assistant, ...` ending with an assistant turn, and
`regenerate_turns` lists the assistant turns' indices. With `data.responses=target` assistant content is cleared:
the target regenerates every assistant turn itself, in order. With `data.responses=dataset` (`keep_replies`) the
row's own assistant turns are kept as the replies to train on, so each must be there and non-empty. A row that
cannot be normalised raises `BadRow` with a reason from `BAD_REASONS`, which prep counts and quarantines instead
of crashing or dropping it silently.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

FORMATS = ("messages", "sharegpt", "alpaca", "prompt")

# Every reason a row can be quarantined for (prep reports a count for each, zeros included).
BAD_REASONS = (
    "invalid_json",         # a JSONL line that is not JSON, or a row that is not a JSON object
    "undecodable_bytes",    # bytes that are not UTF-8
    "unknown_format",       # none of the recognised fields are present
    "missing_role",         # a turn without a role
    "unknown_role",         # a role other than system/user/assistant (or their ShareGPT names)
    "empty_content",        # a system/user turn with empty or whitespace-only content
    "non_string_content",   # content that is not a string
    "wrong_role_order",     # not [system] user, assistant, user, ... (system only first, no two users in a row)
    "too_long",             # more prompt tokens than data.max_prompt_tokens after the chat template (dataset
                            # replies: a reply longer than data.max_response_tokens)
    "no_reply",             # data.responses=dataset: an assistant turn missing or empty (nothing to train on)
)

ROLE_ALIASES = {
    "system": "system", "user": "user", "assistant": "assistant",
    "human": "user", "gpt": "assistant", "model": "assistant", "bot": "assistant", "chatgpt": "assistant",
}


class BadRow(ValueError):
    def __init__(self, reason: str, detail: str):
        assert reason in BAD_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def detect_format(row: dict[str, Any]) -> str:
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        return "sharegpt"
    if "instruction" in row:
        return "alpaca"
    if "prompt" in row:
        return "prompt"
    raise BadRow("unknown_format", f"no messages/conversations/instruction/prompt field (keys: {sorted(row)[:8]})")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadRow("non_string_content", f"{where} is {type(value).__name__}, not a string")
    return value


def _turns_from_list(turns: Any, role_key: str, content_key: str, field: str) -> list[dict[str, str]]:
    if not isinstance(turns, list) or not turns:
        raise BadRow("unknown_format", f"{field} must be a non-empty list of turns")
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise BadRow("unknown_format", f"{field}[{i}] is {type(turn).__name__}, not an object")
        if turn.get(role_key) in (None, ""):
            raise BadRow("missing_role", f"{field}[{i}] has no {role_key!r}")
        raw_role = turn[role_key]
        role = ROLE_ALIASES.get(raw_role.lower()) if isinstance(raw_role, str) else None
        if role is None:
            raise BadRow("unknown_role", f"{field}[{i}] has role {raw_role!r}")
        content = turn.get(content_key, "")
        out.append({"role": role, "content": _text(content, f"{field}[{i}].{content_key}")})
    return out


def _raw_messages(row: dict[str, Any], fmt: str) -> list[dict[str, str]]:
    if fmt == "messages":
        return _turns_from_list(row.get("messages"), "role", "content", "messages")
    if fmt == "sharegpt":
        return _turns_from_list(row.get("conversations"), "from", "value", "conversations")
    if fmt == "alpaca":
        instruction = _text(row.get("instruction"), "instruction")
        extra = _text(row.get("input") or "", "input")
        content = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        msgs = [{"role": "user", "content": content}]
        if row.get("output") is not None:  # the reference reply: cleared unless data.responses=dataset
            msgs.append({"role": "assistant", "content": _text(row["output"], "output")})
        if row.get("system") is not None:
            msgs.insert(0, {"role": "system", "content": _text(row["system"], "system")})
        return msgs
    if fmt == "prompt":
        msgs = [{"role": "user", "content": _text(row.get("prompt"), "prompt")}]
        if row.get("system") is not None:
            msgs.insert(0, {"role": "system", "content": _text(row["system"], "system")})
        return msgs
    raise ValueError(f"unknown format {fmt!r}; choose one of auto, {', '.join(FORMATS)}")


def normalize_row(row: Any, fmt: str = "auto", keep_replies: bool = False) -> tuple[list[dict[str, str]], list[int]]:
    """(messages, regenerate_turns) for one raw row, or raise `BadRow`. keep_replies: the assistant turns keep
    the row's own text (data.responses=dataset); a row without one is `no_reply`."""
    if not isinstance(row, dict):
        raise BadRow("invalid_json", f"row is a JSON {type(row).__name__}, not an object")
    msgs = _raw_messages(row, detect_format(row) if fmt == "auto" else fmt)
    start = 1 if msgs[0]["role"] == "system" else 0
    if any(m["role"] == "system" for m in msgs[start:]):
        raise BadRow("wrong_role_order", "a system turn may only come first")
    body = msgs[start:]
    if body and body[-1]["role"] == "user":
        body = body + [{"role": "assistant", "content": ""}]
    for i, m in enumerate(body):
        expected = "user" if i % 2 == 0 else "assistant"
        if m["role"] != expected:
            order = ", ".join(x["role"] for x in msgs)
            raise BadRow("wrong_role_order", f"turn {start + i} is {m['role']} where {expected} belongs ({order})")
    if not body:
        raise BadRow("wrong_role_order", "no user turn")
    if keep_replies:
        _check_replies(msgs)
    out = msgs[:start]
    regenerate = []
    for m in body:
        if m["role"] == "assistant":
            regenerate.append(len(out))
            out.append(m if keep_replies else {"role": "assistant", "content": ""})
        else:
            out.append(m)
    for i, m in enumerate(out):
        if m["role"] != "assistant" and not m["content"].strip():
            raise BadRow("empty_content", f"turn {i} ({m['role']}) is empty")
    return out, regenerate


def _check_replies(msgs: list[dict[str, str]]) -> None:
    """The dataset's replies are the training targets: every assistant turn has text, and the row ends with one
    (a trailing user turn would be a prompt without its reply)."""
    for i, m in enumerate(msgs):
        if m["role"] == "assistant" and not m["content"].strip():
            raise BadRow("no_reply", f"assistant turn {i} is empty (data.responses=dataset trains on the "
                                     "dataset's own replies)")
    if msgs[-1]["role"] != "assistant":
        raise BadRow("no_reply", f"the row ends with a {msgs[-1]['role']} turn and no assistant reply "
                                 "(data.responses=dataset trains on the dataset's own replies)")


def cleared_replies(messages: list[dict[str, str]], regenerate_turns: list[int]) -> list[dict[str, str]]:
    """The conversation with its assistant turns emptied: a row with the dataset's replies as a prompt (the eval
    split, which evaluate decodes with the target)."""
    return [{"role": "assistant", "content": ""} if i in regenerate_turns else m for i, m in enumerate(messages)]


_WS = re.compile(r"\s+")


def content_key(messages: list[dict[str, str]]) -> str:
    """Dedupe key and stable sample id: hash of roles + whitespace-normalised content."""
    canon = [[m["role"], _WS.sub(" ", m["content"]).strip()] for m in messages]
    return hashlib.sha256(json.dumps(canon, ensure_ascii=False).encode()).hexdigest()[:20]
