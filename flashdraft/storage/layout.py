"""Where each stage's outputs live inside a run's store (`storage.root/<run_id>/`).

One place for the key names, so a stage and its consumers can never disagree about a path. Only names live here;
what the objects hold is documented by the module that writes them (named beside each group).
"""

PROMPTS = "prompts"          # prompts/train-00000.parquet ..., prompts/eval.parquet, prompts/manifest.json
RESPONSES = "responses"      # responses/shard-00000/chunk-00000.parquet ..., responses/shard-00000/DONE
FEATURES = "features"        # features/<shard id>.fds ..., features/manifest.json
CHECKPOINTS = "checkpoints"  # checkpoints/step-00000100/...
EXPORT = "export"            # export/zlab/, export/zlab.manifest.json, export/speculators/, ...
REPORTS = "reports"          # reports/report.html, reports/summary.md
METRICS = "metrics"          # metrics/<stage>.json: what each stage measured, read by the report
STATUS = "status"            # status/<task>.json: each task's state record (flashdraft/run/status.py)
TENSORBOARD = "tensorboard"  # tensorboard/<stage>[/shard-N]/events.out.tfevents.*: `tensorboard --logdir` it
READERS = "readers"          # readers/<run_id>.json: runs that read this run's features (flashdraft/run/source.py)
LEASES = "leases"            # leases/<task>/<generation>.json: one writer per task (flashdraft/storage/lease.py)
SOURCE = "source.json"       # in a run with data.features_from: the source it reads, as at its start


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


def metrics_name(key: str) -> str | None:
    """The task name of a `metrics/<name>.json` key (`train`, `extract-shard-00001`); None for any other key."""
    prefix = METRICS + "/"
    if key.startswith(prefix) and key.endswith(".json"):
        return key[len(prefix): -len(".json")]
    return None


def status_key(task: str) -> str:
    """The committed state record of one task (`task` as named by status.task_name)."""
    return f"{STATUS}/{task}.json"


def responses_shard_prefix(shard: int) -> str:
    return f"{RESPONSES}/{shard_name(shard)}/"


# -- features (flashdraft/features/manifest.py, shard.py) ---------------------------------------------------

FEATURE_PART_SUFFIX = ".fds"
FEATURES_MANIFEST = f"{FEATURES}/manifest.json"


def feature_shard_prefix(shard: int) -> str:
    """Folder of one generation shard's feature parts and its DONE record."""
    return f"{FEATURES}/{shard_name(shard)}/"


def feature_part_key(shard: int, part: int) -> str:
    """Part `part` of a shard, numbered from 0 in commit order (a resumed extraction continues the numbering)."""
    return f"{feature_shard_prefix(shard)}part-{part:05d}{FEATURE_PART_SUFFIX}"


def features_done_key(shard: int) -> str:
    """Committed JSON marking an extraction shard complete (its parts' stats)."""
    return f"{feature_shard_prefix(shard)}DONE"


# -- streaming markers (flashdraft/features/window.py) -----------------------------------------------------

STREAM = f"{FEATURES}/_stream"
STREAM_EOS = f"{STREAM}/EOS"        # producer finished
STREAM_FAILED = f"{STREAM}/FAILED"  # producer failed
STREAM_STOP = f"{STREAM}/STOP"      # consumer stopped


def _per_part(kind: str, part_key: str) -> str:
    """`features/_stream/<kind>/<the part's key, "/" as "__">`: one flat entry per streamed part."""
    return f"{STREAM}/{kind}/{part_key.replace('/', '__')}"


def stream_consumed_prefix(part_key: str) -> str:
    """Folder of the per-worker markers that a streamed part was consumed (ends with "/")."""
    return _per_part("consumed", part_key) + "/"


def stream_consumed_key(part_key: str, worker: int) -> str:
    return f"{stream_consumed_prefix(part_key)}worker-{worker:05d}"


def stream_released_key(part_key: str) -> str:
    """Tombstone of a streamed part the consumer used up and deleted."""
    return _per_part("released", part_key) + ".json"


# -- checkpoints (flashdraft/storage/checkpoint.py) -------------------------------------------------------------------

CHECKPOINT_LATEST = f"{CHECKPOINTS}/latest.json"
# flashdraft's own drafter format (a checkpoint's folder, an export's flashdraft folder): the drafter's geometry as
# JSON beside its trainable weights. Named here, below both the writer (drafter/persistence.py) and the readers
# (drafter/pretrained.py, checkpoint.py).
CONFIG_FILE = "drafter_config.json"
WEIGHTS_FILE = "model.safetensors"


def checkpoint_prefix(step: int) -> str:
    return f"{CHECKPOINTS}/step-{step:08d}"


# -- export (components/export/export.py) and report (components/report/report.py) --------------------------


def export_prefix(fmt: str) -> str:
    """Folder of one exported drafter format (`zlab`, `speculators`): only the files a server loads."""
    return f"{EXPORT}/{fmt}/"


EXPORT_MANIFEST_SUFFIX = ".manifest.json"


def export_manifest_key(fmt: str) -> str:
    """The committed record of one export folder (its files' sha256 and sizes), beside the folder, not in it."""
    return f"{EXPORT}/{fmt}{EXPORT_MANIFEST_SUFFIX}"


def export_format_of(key: str) -> str | None:
    """The format of an `export/<format>.manifest.json` key; None for any other key."""
    prefix = EXPORT + "/"
    if key.startswith(prefix) and key.endswith(EXPORT_MANIFEST_SUFFIX) and "/" not in key[len(prefix):]:
        return key[len(prefix): -len(EXPORT_MANIFEST_SUFFIX)]
    return None


REPORT_HTML = f"{REPORTS}/report.html"
REPORT_MARKDOWN = f"{REPORTS}/summary.md"
REPORT_SCALARS = f"{REPORTS}/metrics.json"
REPORT_CONFIG = f"{REPORTS}/config.json"


def tensorboard_prefix(stage: str, shard: int | None = None) -> str:
    """One task's TensorBoard event files, a TensorBoard "run" each: tensorboard/train/,
    tensorboard/generate/shard-00000/ (a stage's folder holds all of its shards, so `--from` clears them at once)."""
    return f"{TENSORBOARD}/{stage}/" + (f"{shard_name(shard)}/" if shard is not None else "")


def tracking_progress_key(stage: str, shard: int | None = None) -> str:
    """The highest step each of a task's series has logged, so a resumed task never logs a step twice
    (flashdraft/tracking/tracker.py). TensorBoard reads only event files, so it sits beside them."""
    return f"{tensorboard_prefix(stage, shard)}progress.json"


# -- which stage writes what ------------------------------------------------------------------------------------
# The prefixes (and keys) each built-in stage writes besides metrics/<task>.json and status/: its declared
# `outputs` (components/<stage>/stage.py reads its entry here; `--from` deletes them) and what the store advises
# for bytes corrupt at rest (the stage to recompute them from). Here, below both, so the store names a stage
# without importing the registry.
# A stage's TensorBoard series go with its results, so a recomputed stage starts its series afresh
# (flashdraft/tracking/tracker.py drops a step at or below the highest one a task logged).
STAGE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "prep": (f"{PROMPTS}/", tensorboard_prefix("prep")),
    "generate": (f"{RESPONSES}/", tensorboard_prefix("generate")),
    "extract": (f"{FEATURES}/", tensorboard_prefix("extract")),
    "train": (f"{CHECKPOINTS}/", metrics_key("stream"), tensorboard_prefix("train")),
    "export": (f"{EXPORT}/", tensorboard_prefix("export")), "report": (f"{REPORTS}/",)}


def recompute_remedy(key: str) -> str:
    """What to do about an object whose bytes stay wrong on every re-read (corrupt at rest): recompute it from
    the stage that wrote it, as `: ...` to end a message; "" for a key no stage writes."""
    stage = next((name for name, outs in STAGE_OUTPUTS.items() if any(key.startswith(o) for o in outs)), None)
    if stage is None:
        return ""
    return (f": recompute them with `flashdraft run-local --from {stage}` (deletes {stage}'s results and those of "
            "the stages after it), or start a new run_id")
