"""What each stage of a run did, as committed records: running, done (with its headline figures) or failed (with
the exception, the shard and where its full log is).

Every stage body writes one record per task (`status/<stage>.json`, `status/<stage>-shard-KKKKK.json`) when it
starts and when it ends, whether `run_<stage>` returned or raised. The console of a local run, `flashdraft status`,
the report and the KFP Metrics of every step read these records, so all of them tell the same story, including for
a run a person did not start in this terminal. Stages without a record but with metrics (a stage run by hand with
`flashdraft <stage>`) count as done.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore

M = TypeVar("M", bound=BaseModel)

NOT_RUN = "not run"
REUSED = "reused: fingerprint matches"
MAX_ERROR_CHARS = 2000  # the record stays small (an inline commit); the full traceback is in the log

TaskState = Literal["running", "done", "failed"]
StageState = Literal["running", "done", "failed", "not run"]


def task_name(stage: str, shard: int | None = None) -> str:
    """`extract-shard-00001`, the same naming as the stage's metrics file."""
    return stage if shard is None else f"{stage}-{layout.shard_name(shard)}"


def stage_of(task: str) -> str:
    """The stage of a task name: `extract` for `extract-shard-00001` (task_name's inverse)."""
    return task.split("-shard-", 1)[0]


def status_key(stage: str, shard: int | None = None) -> str:
    return layout.status_key(task_name(stage, shard))


class StageRecord(BaseModel):
    """One task's committed status (one stage, or one shard of a fanned-out stage)."""

    stage: str = Field(description="pipeline stage: plan, prep, generate, extract, stream-end, train, ...")
    shard: int | None = Field(default=None, description="shard index for the per-shard stages")
    state: TaskState = Field(description="running from the body's start; done or failed when it ends")
    started: float = Field(description="unix time the task body started")
    ended: float | None = Field(default=None, description="unix time it returned or raised")
    attempt: int = Field(default=1, description="1 + earlier records of this task (retries, reruns)")
    headline: str = Field(default="", description="one line of the stage's key figures")
    figures: dict[str, float] = Field(default_factory=dict, description="the numbers behind the headline")
    error_type: str | None = Field(default=None, description="exception class name of a failed task")
    error: str | None = Field(default=None, description="exception message (truncated), for a failed task")
    log: str | None = Field(default=None, description="where the task's full log is (file or pod)")
    device: str | None = Field(default=None, description="the device the stage's model work ran on (cuda:0, cpu), "
                               "from its summary; None for a stage without one")
    fingerprint: str | None = Field(default=None, description="digest of what the result depends on: the config "
                                    "fields the stage reads and its upstream results' fingerprints (runner.py)")
    inputs: dict[str, Any] = Field(default_factory=dict, description="those config fields' values, by dotted name")
    upstream: dict[str, str | None] = Field(default_factory=dict, description="upstream stage -> its fingerprint")
    reused: bool = Field(default=False, description="done without running: the committed result's fingerprint "
                                                    "matched (started/ended stay those of the run that made it)")
    reused_at: float | None = Field(default=None, description="unix time of the latest reuse")

    @property
    def task(self) -> str:
        return task_name(self.stage, self.shard)

    @property
    def label(self) -> str:
        """Human name: `extract shard 1`."""
        return self.stage if self.shard is None else f"{self.stage} shard {self.shard}"

    @property
    def duration_s(self) -> float | None:
        return None if self.ended is None else round(self.ended - self.started, 2)

    def failure(self) -> str:
        return f"{self.error_type}: {self.error}" if self.error_type else (self.error or "")


class StageStatus(BaseModel):
    """A stage's state over its tasks: failed if any failed, running if any runs, else done; not run if none."""

    stage: str
    state: StageState
    tasks: list[StageRecord] = Field(default_factory=list)
    duration_s: float | None = Field(default=None, description="first start to last end over its tasks")
    headline: str = ""
    figures: dict[str, float] = Field(default_factory=dict)

    @property
    def failed_task(self) -> StageRecord | None:
        return next((t for t in self.tasks if t.state == "failed"), None)


def task_log_location() -> str | None:
    """Where this process's output can be read: the local run's per-task log file, else the pod's logs."""
    if os.environ.get("FLASHDRAFT_TASK_LOG"):
        return os.environ["FLASHDRAFT_TASK_LOG"]
    pod = os.environ.get("KFP_POD_NAME") or (os.environ.get("HOSTNAME") if os.environ.get(
        "KUBERNETES_SERVICE_HOST") else None)
    if not pod:
        return None
    ns_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    ns = open(ns_file).read().strip() if os.path.exists(ns_file) else None  # noqa: SIM115 - tiny read
    return f"pod {pod}: kubectl{f' -n {ns}' if ns else ''} logs {pod} -c main"


# -- headline figures ---------------------------------------------------------------------------------------


def combine(per_task: Iterable[dict[str, float]]) -> dict[str, float]:
    """Figures of a fanned-out stage over its shards: generate and extract figures are counts and seconds, so
    the stage's figure is their sum (rates come after, from the sums)."""
    out: dict[str, float] = {}
    for figs in per_task:
        for key, value in figs.items():
            out[key] = out.get(key, 0.0) + value
    return out


# -- reading ------------------------------------------------------------------------------------------------


def read_committed(store: ObjectStore, prefix: str, model: type[M]) -> list[M]:
    """Every committed JSON record under `prefix` as `model`; an unreadable one is skipped, so one bad record
    cannot hide the others."""
    out = []
    for key in store.list_committed(prefix):
        try:
            out.append(model.model_validate(store.get_json_verified(key)))
        except Exception:  # noqa: BLE001 - one bad record must not hide the others
            continue
    return out


def read_records(store: ObjectStore) -> list[StageRecord]:
    """Every committed task record of the run (unreadable ones are skipped: the metrics still show the stage)."""
    return read_committed(store, layout.STATUS + "/", StageRecord)


def metrics_names(store: ObjectStore) -> list[str]:
    """Names of the committed metrics files (`train`, `extract-shard-00001`), without reading them."""
    names = (layout.metrics_name(k) for k in store.list_committed(layout.METRICS + "/"))
    return [n for n in names if n is not None]


def is_run(store: ObjectStore) -> bool:
    """Whether the store holds a run: any committed task record or metrics file (every stage writes one)."""
    return any(store.list_committed(prefix + "/") for prefix in (layout.STATUS, layout.METRICS))


def find_runs(store: ObjectStore, max_probes: int = 100) -> list[str]:
    """Runs below a store root (`status --run file://./runs`, the root instead of a run), as paths relative to
    it: the folders one level down that hold a run, else two levels down (a root over several roots). At most
    `max_probes` folders are listed, so a large bucket costs a bounded number of requests."""
    found: list[str] = []
    probes = 0
    frontier = [""]
    for _depth in range(2):
        deeper = []
        for parent in frontier:
            for name in store.folders(parent):
                if probes >= max_probes:
                    return found
                probes += 1
                path = f"{parent}/{name}" if parent else name
                if is_run(store.child(path)):
                    found.append(path)
                elif not name.startswith("."):
                    deeper.append(path)
        if found:
            return found
        frontier = deeper
    return found


def no_run_message(store: ObjectStore, root: ObjectStore | None = None, command: str = "status") -> str:
    """One line for a store that holds no run: say so, then list the runs below it (or below `root`, the
    storage.root of a configured run that has not started), with the `flashdraft <command>` for one of them."""
    where = root or store
    runs = find_runs(where)
    line = f"no run at {store.url()}: no task records (status/) or metrics (metrics/) committed there"
    if runs:
        shown = ", ".join(runs[:20]) + (f" and {len(runs) - 20} more" if len(runs) > 20 else "")
        return f"{line}; runs under {where.url()}: {shown} (flashdraft {command} --run {where.url(runs[0])})"
    return f"{line}, and no run under {where.url()}"


def read_record(store: ObjectStore, stage: str, shard: int | None = None) -> StageRecord | None:
    key = status_key(stage, shard)
    if not store.is_committed(key):
        return None
    try:
        return StageRecord.model_validate(store.get_json_verified(key))
    except Exception:  # noqa: BLE001
        return None


def shards(store: ObjectStore, stage: str) -> list[int]:
    """The shards of a per-shard stage that have a status record."""
    prefix = f"{layout.STATUS}/{stage}-shard-"
    out = []
    for key in store.list_committed(layout.STATUS + "/"):
        if key.startswith(prefix) and key.endswith(".json"):
            try:
                out.append(int(key[len(prefix): -len(".json")]))
            except ValueError:
                continue
    return sorted(out)


def stage_records(store: ObjectStore, stage: str, per_shard: bool) -> list[StageRecord | None]:
    """A stage's committed task records: one per shard with a record for a per-shard stage, else its one record
    (None where unreadable or absent)."""
    if not per_shard:
        return [read_record(store, stage)]
    return [read_record(store, stage, k) for k in shards(store, stage)]


def first_failure(statuses: Iterable[StageStatus]) -> StageRecord | None:
    """The failed task of the earliest failed stage (what a person debugging the run looks at first)."""
    return next((s.failed_task for s in statuses if s.failed_task is not None), None)


def describe(status: StageStatus) -> str:
    """The state column's text: `done`, `failed: ValueError: ... (shard 1; log: ...)`, `running (1/2 shards)`."""
    if status.state == "failed" and status.failed_task is not None:
        t = status.failed_task
        where = f"shard {t.shard}; " if t.shard is not None else ""
        return f"failed: {t.failure()} ({where}log: {t.log or 'not recorded'})"
    if status.state == "running":
        done = sum(t.state == "done" for t in status.tasks)
        return f"running ({done}/{len(status.tasks)} tasks done)" if len(status.tasks) > 1 else "running"
    if status.state == "done" and status.tasks and all(t.reused for t in status.tasks):
        return REUSED
    if status.state == "done" and any(t.reused for t in status.tasks):
        return f"done ({sum(t.reused for t in status.tasks)}/{len(status.tasks)} tasks reused)"
    return status.state


def now() -> float:
    return round(time.time(), 3)
