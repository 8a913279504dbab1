"""Stage 2, response generation for one prompt shard: the target answers every prompt; the responses become the
drafter's training sequences.

Exactly-once by construction: the shard's prompts are cut into fixed chunks of `generation.chunk_size`; each
chunk is generated and committed as `responses/shard-K/chunk-N.parquet` with the task's fingerprint in its
commit record; `DONE` is committed last. A restarted pod skips committed chunks. Whether the shard runs at all is
the runner's decision (flashdraft/run/runner.py): a finished shard whose fingerprint (model, template, sampling
config, the prompts' own fingerprint) matches is reused, a changed one is refused before any chunk is touched.
Sampling seeds derive from (seed, sample id, turn), so resumed runs regenerate exactly what an uninterrupted run
would have.

Multi-turn prompts are answered turn by turn: every regenerated assistant turn is conditioned on the target's own
earlier replies and is covered by the loss mask.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from flashdraft.components.generate.summary import GenerateSummary
from flashdraft.config import RunConfig
from flashdraft.run.records import (
    PROMPT_SCHEMA,
    RESPONSE_SCHEMA,
    parquet_bytes_to_table,
    rows_to_table,
    table_to_parquet_bytes,
)
from flashdraft.storage import layout
from flashdraft.storage.store import NotCommittedError, ObjectStore, io_counters, open_store
from flashdraft.target.chat import Reply, build_turn

log = logging.getLogger(__name__)


def _sample_seed(seed: int, sample_id: str, turn: int) -> int:
    return int(hashlib.sha256(f"{seed}:{sample_id}:{turn}".encode()).hexdigest()[:8], 16)


def _finish_reason(replies: list[Reply]) -> str:
    if any(not r.stopped for r in replies):
        return "length"
    if any(len(r.ids) <= 1 for r in replies):  # nothing but the stop token
        return "empty"
    return "stop"


def generate_chunk(backend, tok, rows: list[dict], seed: int, template_kwargs: dict[str, Any] | None = None
                   ) -> tuple[list[dict], dict[str, int]]:
    """Answer every prompt of a chunk, turn by turn; returns RESPONSE_SCHEMA rows and token counts (and, for a
    backend that counts them, the forward's FLOPs: `forward_flops`)."""
    cost = getattr(backend, "cost", None)
    flops = 0.0
    convs = [json.loads(r["messages"]) for r in rows]
    turns = [list(r["regenerate_turns"]) for r in rows]
    replies: list[dict[int, Reply]] = [{} for _ in rows]
    prompt_tokens = 0
    for t in range(max(len(x) for x in turns)):
        active = [j for j in range(len(rows)) if len(turns[j]) > t]
        prompts = [build_turn(tok, convs[j], turns[j][t], replies[j], template_kwargs)[0] for j in active]
        prompt_tokens += sum(len(p) for p in prompts)
        outs = backend.generate(prompts, [_sample_seed(seed, rows[j]["sample_id"], t) for j in active])
        for j, prompt, out in zip(active, prompts, outs, strict=True):
            replies[j][turns[j][t]] = out
            flops += cost.reply(len(prompt), len(out.ids)) if cost else 0.0
    records = []
    for j, row in enumerate(rows):
        last = turns[j][-1]
        earlier = {k: v for k, v in replies[j].items() if k != last}
        ids, mask = build_turn(tok, convs[j], last, earlier, template_kwargs)
        final = replies[j][last]
        ids, mask = ids + final.ids, mask + [1] * len(final.ids)
        records.append({"sample_id": row["sample_id"], "input_ids": ids, "loss_mask": mask,
                        "prompt_len": mask.index(1) if 1 in mask else len(mask),
                        "response_text": tok.decode(final.ids, skip_special_tokens=True),
                        "finish_reason": _finish_reason(list(replies[j].values()))})
    stats = {"samples": len(rows), "turns": sum(len(x) for x in turns), "prompt_tokens": prompt_tokens,
             "generated_tokens": sum(len(r.ids) for rep in replies for r in rep.values()),
             "empty": sum(r["finish_reason"] == "empty" for r in records),
             "truncated": sum(r["finish_reason"] == "length" for r in records)}
    if cost:
        stats["forward_flops"] = flops
    return records, stats


def _gemm_share(chunks, gemm_rate: float | None) -> dict[str, float]:
    """The forward's FLOPs over the chunks that counted them, and their share of what this CPU's measured GEMM
    rate would have done in those chunks' seconds; {} on a GPU or the vllm backend (nothing measured)."""
    counted = [m for m in chunks if "forward_flops" in m]
    seconds = sum(m["seconds"] for m in counted)
    if not gemm_rate or not counted or seconds <= 0:
        return {}
    flops = sum(m["forward_flops"] for m in counted)
    return {"forward_flops": flops, "gemm_flops_per_s": round(gemm_rate),
            "gemm_share": round(flops / (seconds * gemm_rate), 4)}


def _load_prompts(store: ObjectStore, shard: int) -> list[dict]:
    try:
        manifest = store.get_json_verified(layout.PROMPTS_MANIFEST)
    except NotCommittedError:
        raise NotCommittedError(f"{store.url(layout.PROMPTS_MANIFEST)} is missing: run `flashdraft prep` first"
                                ) from None
    n_shards = manifest["summary"]["num_shards"]
    if not 0 <= shard < n_shards:
        raise ValueError(f"--shard {shard} is out of range: prep made {n_shards} shard(s) (0..{n_shards - 1})")
    key = layout.prompt_shard_key(shard)
    table = parquet_bytes_to_table(store.get_verified(key), PROMPT_SCHEMA)
    return table.to_pylist()


def run_generate(cfg: RunConfig, shard: int) -> GenerateSummary:
    """Generate (or resume, or confirm) responses for prompt shard `shard`; returns the shard's DONE record."""
    io0 = io_counters()
    from tqdm import tqdm

    from flashdraft.perf.cpu_gemm import measure_gemm_flops
    from flashdraft.run.runner import task_fingerprint
    from flashdraft.target.model import load_tokenizer, set_cpu_threads

    from .backends import make_backend

    set_cpu_threads(cfg)
    store = open_store(cfg.storage, cfg.run_id)
    rows = _load_prompts(store, shard)
    tok = load_tokenizer(cfg.target)
    fingerprint = task_fingerprint(cfg, "generate", shard, store).digest
    done_key = layout.responses_done_key(shard)

    size = cfg.generation.chunk_size
    chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
    chunk_meta: dict[int, dict] = {}
    for i in range(len(chunks)):
        record = store.read_commit(layout.response_chunk_key(shard, i))
        if record is not None:
            chunk_meta[i] = record.meta
    todo = [i for i in range(len(chunks)) if i not in chunk_meta]
    log.info("shard %d: %d prompts in %d chunks, %d already committed", shard, len(rows), len(chunks),
             len(chunks) - len(todo))
    startup_s, device, gemm_rate = 0.0, None, None
    if todo:
        t0 = time.time()
        max_len = max(r["prompt_tokens"] + len(r["regenerate_turns"]) * cfg.data.max_response_tokens for r in rows)
        backend = make_backend(cfg, tok, max_model_len=max_len + 64)
        startup_s = round(time.time() - t0, 2)
        device = getattr(backend, "device", None)  # hf: cuda or cpu; vllm runs in its own worker
        if getattr(backend, "cost", None):  # hf on a CPU: what this machine's GEMMs do at best
            gemm_rate = measure_gemm_flops()
        try:
            for i in tqdm(todo, desc=f"generate shard {shard}", unit="chunk"):
                t = time.time()
                records, stats = generate_chunk(backend, tok, chunks[i], cfg.generation.seed,
                                                cfg.data.chat_template_kwargs)
                seconds = time.time() - t
                meta = {"fingerprint": fingerprint, **stats, "seconds": round(seconds, 4)}
                store.commit(layout.response_chunk_key(shard, i),
                             table_to_parquet_bytes(rows_to_table(records, RESPONSE_SCHEMA)), meta)
                chunk_meta[i] = meta
                log.info("shard %d chunk %d: %d samples, %d tokens, %.1f tokens/s", shard, i, stats["samples"],
                         stats["generated_tokens"], stats["generated_tokens"] / max(seconds, 1e-9))
        finally:
            backend.close()

    totals = {k: sum(m[k] for m in chunk_meta.values())
              for k in ("samples", "turns", "prompt_tokens", "generated_tokens", "empty", "truncated")}
    seconds = sum(m["seconds"] for m in chunk_meta.values())
    summary = GenerateSummary(
        shard=shard, num_chunks=len(chunks), chunks_generated_now=len(todo), **totals,
        generation_seconds=round(seconds, 3), tokens_per_s=round(totals["generated_tokens"] / max(seconds, 1e-9), 2),
        backend_startup_s=startup_s, backend=cfg.generation.backend, fingerprint=fingerprint,
        **({"device": str(device)} if device else {}), **_gemm_share(chunk_meta.values(), gemm_rate))
    store.commit_json(done_key, summary.dump())  # the DONE record: the summary before this attempt's store I/O
    log.info("shard %d done: %d samples, %d generated tokens, %.1f tokens/s, %d empty, %d truncated%s", shard,
             totals["samples"], totals["generated_tokens"], summary.tokens_per_s, totals["empty"],
             totals["truncated"], f", gemm share {summary.gemm_share:.0%}" if summary.gemm_share is not None else "")
    summary.store_io = io_counters(io0)
    return summary
