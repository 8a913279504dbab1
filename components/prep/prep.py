"""Stage 1, prompt prep: sources -> cleaned, deduplicated, length-filtered, shuffled prompt shards.

Pipeline: read every source row -> normalise to chat messages (bad rows to quarantine with source, row number
and reason) -> exact dedupe on normalised content -> length filter with the target's tokenizer and chat template
-> deterministic shuffle by `data.seed` -> cap at `data.max_samples` -> eval split (`data.eval_count`, from the
sources that may be held out) -> N train shards. Everything is committed through the store; the manifest goes last.
Whether prep runs again is the runner's decision (flashdraft/run/runner.py): the same data config is reused, a
different one refused.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
import time
from collections import Counter

from flashdraft.components.prep.summary import RESPONSES_SOURCE, PrepSummary, TokenStats
from flashdraft.config import RunConfig
from flashdraft.run.records import PROMPT_SCHEMA, rows_to_table, table_to_parquet_bytes
from flashdraft.storage import layout
from flashdraft.storage.store import io_counters, open_store
from flashdraft.target.chat import prompt_token_count

from .formats import BAD_REASONS, BadRow, cleared_replies, content_key, normalize_row
from .replies import check_reply_lengths, write_dataset_responses
from .sources import SourceError, iter_source

log = logging.getLogger(__name__)


def _token_stats(counts: list[int]) -> TokenStats:
    if not counts:
        return TokenStats()
    ordered = sorted(counts)
    return TokenStats(min=ordered[0], mean=round(statistics.fmean(ordered), 1), p50=ordered[len(ordered) // 2],
                      p95=ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], max=ordered[-1],
                      total=sum(ordered))


def _read_sources(cfg: RunConfig, tok) -> tuple[list[dict], list[dict], dict[str, dict[str, int]]]:
    """(kept rows, quarantine entries, per-source counts); every read row ends up in exactly one of kept,
    quarantined or duplicate."""
    kept: list[dict] = []
    quarantine: list[dict] = []
    seen: set[str] = set()
    per_source: dict[str, dict[str, int]] = {}
    dataset = cfg.data.responses == "dataset"
    for spec in cfg.data.sources:
        counts = Counter()
        for number, raw in iter_source(spec, cfg.storage):
            if spec.max_rows is not None and counts["read"] >= spec.max_rows:
                break
            counts["read"] += 1
            try:
                if isinstance(raw, BadRow):
                    raise raw
                messages, regen = normalize_row(raw, spec.format, keep_replies=dataset)
                sample_id = content_key(messages)
                if sample_id in seen:
                    counts["duplicate"] += 1
                    continue
                n_tokens = prompt_token_count(tok, messages, regen, cfg.data.chat_template_kwargs)
                if n_tokens > cfg.data.max_prompt_tokens:
                    raise BadRow("too_long", f"{n_tokens} prompt tokens > data.max_prompt_tokens="
                                             f"{cfg.data.max_prompt_tokens}")
                if dataset:
                    check_reply_lengths(tok, messages, regen, cfg.data.max_response_tokens)
            except BadRow as bad:
                counts[bad.reason] += 1
                quarantine.append({"source": spec.uri, "row": number, "reason": bad.reason, "detail": bad.detail})
                continue
            seen.add(sample_id)
            counts["kept"] += 1
            kept.append({"sample_id": sample_id, "messages": json.dumps(messages, ensure_ascii=False),
                         "regenerate_turns": regen, "source": spec.uri, "source_row": number,
                         "prompt_tokens": n_tokens})
        if counts["kept"] == 0 and counts["duplicate"] == 0:
            reasons = ", ".join(f"{k}={v}" for k, v in counts.items() if k != "read") or "no rows"
            raise SourceError(f"source {spec.uri}: zero valid rows out of {counts['read']} ({reasons})")
        per_source[spec.uri] = dict(counts)
        log.info("source %s: %s", spec.uri, dict(counts))
    return kept, quarantine, per_source


def _split_eval(used: list[dict], cfg: RunConfig) -> tuple[list[dict], list[dict]]:
    """(eval rows, train rows): the first `data.eval_count` shuffled rows of sources that may be held out
    (`SourceSpec.heldout`), and every other row in its shuffled order."""
    train_only = {spec.uri for spec in cfg.data.sources if not spec.heldout}
    eligible = [i for i, row in enumerate(used) if row["source"] not in train_only]
    held = set(eligible[: cfg.data.eval_count])
    return [used[i] for i in sorted(held)], [row for i, row in enumerate(used) if i not in held]


def _markdown(summary: PrepSummary) -> str:
    """The prep table the console, the report and the manifest show."""
    tokens = summary.prompt_tokens
    lines = ["| prompts | count |", "|---|---:|",
             f"| rows read | {summary.rows_read} |",
             f"| kept (unique, valid, within length) | {summary.kept} |",
             f"| exact duplicates removed | {summary.duplicates} |",
             f"| quarantined | {summary.quarantined} |"]
    lines += [f"| &nbsp;&nbsp;{reason} | {n} |" for reason, n in summary.bad_rows.items() if n]
    lines += [f"| used (after max_samples) | {summary.num_train + summary.num_eval} |",
              f"| train / eval | {summary.num_train} / {summary.num_eval} |",
              f"| train shards | {summary.num_shards} |",
              f"| prompt tokens min / p50 / mean / p95 / max | {tokens.min} / {tokens.p50} / {tokens.mean} / "
              f"{tokens.p95} / {tokens.max} |",
              f"| multi-turn prompts | {summary.multi_turn} |",
              f"| responses | {RESPONSES_SOURCE[summary.responses]} |",
              f"| tokenizer / chat template sha | {summary.tokenizer_sha} / {summary.chat_template_sha} |",
              "", "| source | read | kept |", "|---|---:|---:|"]
    lines += [f"| {uri} | {c.get('read', 0)} | {c.get('kept', 0)} |" for uri, c in summary.sources.items()]
    return "\n".join(lines) + "\n"


def run_prep(cfg: RunConfig) -> PrepSummary:
    """Prepare the run's prompts; returns the summary (with `num_shards` and a Markdown table)."""
    from flashdraft.target.model import load_tokenizer, tokenizer_fingerprint

    t0, io0 = time.time(), io_counters()
    store = open_store(cfg.storage, cfg.run_id)
    tok = load_tokenizer(cfg.target)
    tok_fp = tokenizer_fingerprint(tok)

    kept, quarantine, per_source = _read_sources(cfg, tok)
    random.Random(cfg.data.seed).shuffle(kept)
    used = kept[: cfg.data.max_samples] if cfg.data.max_samples else kept
    eval_rows, train_rows = _split_eval(used, cfg)
    n_shards = cfg.data.num_shards
    if len(train_rows) < n_shards:
        raise SourceError(f"only {len(train_rows)} train prompts for data.num_shards={n_shards} "
                          f"({len(used)} used, data.eval_count={cfg.data.eval_count})")

    bounds = [round(i * len(train_rows) / n_shards) for i in range(n_shards + 1)]
    shards = [train_rows[bounds[i]:bounds[i + 1]] for i in range(n_shards)]
    for i, rows in enumerate(shards):
        store.commit(layout.prompt_shard_key(i), table_to_parquet_bytes(rows_to_table(rows, PROMPT_SCHEMA)),
                     {"rows": len(rows)})
    replies = None
    if cfg.data.responses == "dataset":
        replies = write_dataset_responses(store, tok, shards, cfg.data.chat_template_kwargs)
        eval_rows = [{**r, "messages": json.dumps(cleared_replies(json.loads(r["messages"]), r["regenerate_turns"]),
                                                  ensure_ascii=False)} for r in eval_rows]  # prompts for evaluate
    store.commit(layout.EVAL_PROMPTS, table_to_parquet_bytes(rows_to_table(eval_rows, PROMPT_SCHEMA)),
                 {"rows": len(eval_rows)})
    store.commit(layout.PROMPTS_QUARANTINE, "".join(json.dumps(q) + "\n" for q in quarantine).encode(),
                 {"rows": len(quarantine)})

    bad = {reason: sum(c.get(reason, 0) for c in per_source.values()) for reason in BAD_REASONS}
    summary = PrepSummary(
        num_shards=n_shards, num_train=len(train_rows), num_eval=len(eval_rows),
        shard_rows=[len(rows) for rows in shards], rows_read=sum(c.get("read", 0) for c in per_source.values()),
        kept=len(kept), duplicates=sum(c.get("duplicate", 0) for c in per_source.values()),
        quarantined=len(quarantine), bad_rows=bad, multi_turn=sum(len(r["regenerate_turns"]) > 1 for r in used),
        prompt_tokens=_token_stats([r["prompt_tokens"] for r in used]), sources=per_source,
        tokenizer_sha=tok_fp["tokenizer_sha"], chat_template_sha=tok_fp["chat_template_sha"], seed=cfg.data.seed,
        seconds=round(time.time() - t0, 2), shard_keys=[layout.prompt_shard_key(i) for i in range(n_shards)],
        eval_key=layout.EVAL_PROMPTS, quarantine_key=layout.PROMPTS_QUARANTINE, responses=cfg.data.responses,
        reply_tokens=sum(r.reply_tokens for r in replies) if replies is not None else None)
    summary.markdown = _markdown(summary)
    store.commit_json(layout.PROMPTS_MANIFEST, {"summary": summary.dump(), "target": cfg.target.model,
                                                "max_prompt_tokens": cfg.data.max_prompt_tokens})
    log.info("prep: %d train prompts in %d shards, %d eval, %d quarantined, %d duplicates (%.1f s)",
             len(train_rows), n_shards, len(eval_rows), len(quarantine), summary.duplicates, summary.seconds)
    summary.store_io = io_counters(io0)  # after the manifest, which keeps the prompts' summary only
    return summary
