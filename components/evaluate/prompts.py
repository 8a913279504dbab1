"""Held-out evaluation prompts: prep's eval split plus an optional user JSONL, as token ids for the target.

A prompt is cut before its first assistant turn the target would regenerate (prep leaves those as placeholders),
so the target answers the opening request; the chat template adds the generation prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashdraft.config import RunConfig
from flashdraft.run.records import PROMPT_SCHEMA, parquet_bytes_to_table
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore

EVAL_PROMPTS_KEY = layout.EVAL_PROMPTS


@dataclass(frozen=True)
class EvalPrompt:
    prompt_id: str
    input_ids: list[int]
    source: str


def opening_messages(messages: list[dict[str, Any]], regenerate_turns: list[int] | None) -> list[dict[str, Any]]:
    """The conversation up to (not including) the first regenerated assistant turn, minus trailing assistant
    turns, so the target speaks next."""
    cut = min(regenerate_turns) if regenerate_turns else len(messages)
    head = list(messages[:cut])
    while head and head[-1].get("role") == "assistant":
        head.pop()
    return head


def encode_chat(tok, messages: list[dict[str, Any]], where: str,
                template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Generation-prompt token ids, rendered exactly as the generate stage renders training prompts
    (`template_kwargs`: the suite's chat template arguments, e.g. enable_thinking)."""
    from flashdraft.target.chat import build_turn

    if not messages:
        raise ValueError(f"{where}: no user/system message before the first assistant turn")
    return build_turn(tok, messages, len(messages), {}, template_kwargs)[0]


def _read_text(uri: str, cfg: RunConfig) -> str:
    if "://" in uri and not uri.startswith("file://"):
        folder, name = uri.rsplit("/", 1)
        return ObjectStore(folder, cfg.storage).get(name).decode()
    path = Path(uri.removeprefix("file://")).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"eval.extra_prompts: {path} does not exist")
    return path.read_text()


def extra_prompts(cfg: RunConfig, tok, template_kwargs: dict[str, Any] | None = None) -> list[EvalPrompt]:
    """User JSONL, one object per line: {"prompt": str} or {"messages": [...]}, optional "id"."""
    uri = cfg.eval.extra_prompts
    if not uri:
        return []
    out = []
    for n, line in enumerate(_read_text(uri, cfg).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"eval.extra_prompts {uri} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: invalid JSON ({exc})") from None
        if isinstance(row, dict) and isinstance(row.get("messages"), list):
            messages = opening_messages(row["messages"], None)
        elif isinstance(row, dict) and isinstance(row.get("prompt"), str):
            messages = [{"role": "user", "content": row["prompt"]}]
        else:
            raise ValueError(f"{where}: expected an object with a 'prompt' string or a 'messages' list")
        ids = encode_chat(tok, messages, where, template_kwargs)
        out.append(EvalPrompt(str(row.get("id", f"extra-{n}")), ids, uri))
    return out


def split_prompts(store: ObjectStore, tok, template_kwargs: dict[str, Any] | None = None) -> list[EvalPrompt]:
    """prep's committed eval split (`prompts/eval.parquet`); empty if prep wrote none."""
    if not store.is_committed(EVAL_PROMPTS_KEY):
        return []
    table = parquet_bytes_to_table(store.get_verified(EVAL_PROMPTS_KEY), PROMPT_SCHEMA)
    out = []
    for row in table.to_pylist():
        where = f"{store.url(EVAL_PROMPTS_KEY)} sample {row['sample_id']}"
        try:
            messages = json.loads(row["messages"])
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: messages is not JSON ({exc})") from None
        ids = encode_chat(tok, opening_messages(messages, row["regenerate_turns"]), where, template_kwargs)
        out.append(EvalPrompt(row["sample_id"], ids, EVAL_PROMPTS_KEY))
    return out


def heldout_prompts(cfg: RunConfig, store: ObjectStore, tok, count: int,
                    template_kwargs: dict[str, Any] | None = None) -> list[EvalPrompt]:
    """The built-in `heldout` suite: up to `count` prompts of the eval split, then every extra prompt."""
    prompts = split_prompts(store, tok, template_kwargs)[:count] + extra_prompts(cfg, tok, template_kwargs)
    if not prompts:
        raise FileNotFoundError(f"no evaluation prompts: {store.url(EVAL_PROMPTS_KEY)} is not committed (run "
                                "`flashdraft prep`) and eval.extra_prompts is not set")
    return prompts


def keep_tail(prompts: list[EvalPrompt], limit: int) -> list[EvalPrompt]:
    """Prompts longer than `limit` (data.max_prompt_tokens) keep their last tokens: the generation prompt must
    survive."""
    return [EvalPrompt(p.prompt_id, p.input_ids[-limit:], p.source) for p in prompts]


def load_eval_prompts(cfg: RunConfig, store: ObjectStore, tok) -> list[EvalPrompt]:
    """The `heldout` suite as the default config renders it (eval.num_prompts, data.chat_template_kwargs)."""
    return keep_tail(heldout_prompts(cfg, store, tok, cfg.eval.num_prompts, cfg.data.chat_template_kwargs),
                     cfg.data.max_prompt_tokens)
