"""Where each stage's outputs live inside a run's store (`storage.root/<run_id>/`).

One place for the key names, so a stage and its consumers can never disagree about a path.
"""

PROMPTS = "prompts"          # prompts/train-00000.parquet ..., prompts/eval.parquet, prompts/manifest.json
RESPONSES = "responses"      # responses/shard-00000/chunk-00000.parquet ..., responses/shard-00000/DONE
FEATURES = "features"        # features/<shard id>.fds ..., features/manifest.json
CHECKPOINTS = "checkpoints"  # checkpoints/step-00000100/...
EXPORT = "export"            # export/zlab/, export/speculators/
REPORTS = "reports"          # reports/report.html, reports/summary.md
METRICS = "metrics"          # metrics/<stage>.json: what each stage measured, read by the report


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def prompt_shard_key(index: int) -> str:
    """Train prompts for generation shard `index` (written by prep, read by generate)."""
    return f"{PROMPTS}/train-{index:05d}.parquet"


EVAL_PROMPTS = f"{PROMPTS}/eval.parquet"          # held-out prompts (same schema), for evaluate
PROMPTS_MANIFEST = f"{PROMPTS}/manifest.json"     # counts, token stats, tokenizer hashes, sources, num_shards
PROMPTS_QUARANTINE = f"{PROMPTS}/quarantine.jsonl"  # rejected rows: source, row, reason, detail


def response_chunk_key(shard: int, chunk: int) -> str:
    return f"{RESPONSES}/{shard_name(shard)}/chunk-{chunk:05d}.parquet"


def responses_done_key(shard: int) -> str:
    """Committed JSON marking a generation shard complete (tokens/s, counts, generation fingerprint)."""
    return f"{RESPONSES}/{shard_name(shard)}/DONE"


def metrics_key(stage: str) -> str:
    return f"{METRICS}/{stage}.json"
