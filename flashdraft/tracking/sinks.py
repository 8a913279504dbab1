"""The tracker backends: TensorBoard event files in the run's store, an MLflow run, a W&B run.

Each imports its package when opened (none is needed by a run that does not name it), and raises on any failure:
the `Tracker` (tracker.py) turns that into one warning and leaves the backend out.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flashdraft.storage.store import ObjectStore

DEFAULT_EXPERIMENT = "flashdraft"
# MLflow retries a refused connection for minutes by default; a tracker must not hold a stage that long.
MLFLOW_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
MLFLOW_RUN_TAG = "flashdraft.run_id"
MLFLOW_BATCH = 200  # MLflow's log_batch takes at most 1000 metrics and 100 params a call
MLFLOW_PARAM_CHARS = 6000


class TensorBoardSink:
    """Scalars into TensorBoard event files under `<run>/tensorboard/<stage>[/shard-N]/`, so `tensorboard --logdir
    <run store URI>/tensorboard` (local or s3://) shows every task as a run. Events are written to a local spool
    file and copied into the store at each flush (an object store has no append); a file is rotated at
    `rotate_bytes`, so a days-long run never re-uploads more than that per flush."""

    name = "tensorboard"

    def __init__(self, store: ObjectStore, prefix: str, rotate_bytes: int = 8 * 2**20):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer_type = EventFileWriter
        self.store = store
        self.prefix = prefix  # layout.tensorboard_prefix: the task's folder, ending in "/"
        self.rotate_bytes = rotate_bytes
        self.spool = Path(tempfile.mkdtemp(prefix="flashdraft-tensorboard-"))
        self._open_writer()

    def _open_writer(self) -> None:
        """A new spool file, and its name in the store: TensorBoard reads a folder's event files in name order and
        drops the points of an earlier file at or above a later file's first step, so the name sorts by creation
        time in nanoseconds (EventFileWriter's own name has whole seconds and a per-process counter, which can
        sort a task's second attempt first)."""
        self.writer = self._writer_type(str(self.spool))
        self.key = f"{self.prefix}events.out.tfevents.{time.time_ns():020d}.{socket.gethostname()}.{os.getpid()}"

    def log(self, metrics: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in metrics.items()]
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))

    def artifact(self, name: str, data: bytes) -> None:
        """TensorBoard keeps no files."""

    def flush(self) -> None:
        self.writer.flush()
        path = next(self.spool.glob("events.out.tfevents.*"))  # one at a time: a rotated file is deleted
        self.store.put(self.key, path.read_bytes())
        if path.stat().st_size >= self.rotate_bytes:
            self.writer.close()
            path.unlink()
            self._open_writer()

    def close(self) -> None:
        self.flush()
        self.writer.close()
        shutil.rmtree(self.spool, ignore_errors=True)


class MlflowSink:
    """One MLflow run per flashdraft run, named after the run id and found again by its `flashdraft.run_id` tag,
    so a rerun stage or a restarted pod reopens it rather than starting another. MLFLOW_TRACKING_URI (required:
    MLflow's own default, ./mlruns, would vanish with the pod), MLFLOW_EXPERIMENT_NAME (default flashdraft), and
    MLflow's own credential variables (MLFLOW_TRACKING_TOKEN, _USERNAME/_PASSWORD) from the environment."""

    name = "mlflow"

    def __init__(self, run_id: str, params: dict[str, str]):
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise RuntimeError("MLFLOW_TRACKING_URI is not set (tracking.report_to names mlflow)")
        for key, value in MLFLOW_DEFAULTS.items():
            os.environ.setdefault(key, value)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        self.run_id = self._open_run(self._experiment_id(experiment), run_id)
        self._log_new_params(params)

    def _experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # another task created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _open_run(self, experiment_id: str, run_id: str) -> str:
        runs = self.client.search_runs([experiment_id], filter_string=f"tags.`{MLFLOW_RUN_TAG}` = '{run_id}'",
                                       max_results=1, order_by=["attributes.start_time ASC"])
        if runs:
            self.client.update_run(runs[0].info.run_id, status="RUNNING")
            return runs[0].info.run_id
        return self.client.create_run(experiment_id, run_name=run_id, tags={MLFLOW_RUN_TAG: run_id}).info.run_id

    def _log_new_params(self, params: dict[str, str]) -> None:
        """Parameters the MLflow run lacks (MLflow refuses to change a logged one: a carried-on run with more
        steps keeps its first value, and the store's status records say what changed)."""
        from mlflow.entities import Param

        known = self.client.get_run(self.run_id).data.params
        new = [Param(k, v[:MLFLOW_PARAM_CHARS]) for k, v in params.items() if k not in known]
        for start in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[start:start + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        items = [Metric(_mlflow_key(k), v, stamp, step) for k, v in metrics.items()]
        for start in range(0, len(items), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=items[start:start + MLFLOW_BATCH])

    def artifact(self, name: str, data: bytes) -> None:
        with _as_file(name, data) as path:
            parent = str(Path(name).parent)
            self.client.log_artifact(self.run_id, str(path), None if parent == "." else parent)

    def flush(self) -> None:
        """Every call is sent as it is made."""

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


@contextmanager
def _as_file(name: str, data: bytes) -> Iterator[Path]:
    """`data` as a temporary file named like `name`'s last part: MLflow and W&B upload files, not bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(name).name
        path.write_bytes(data)
        yield path


def _mlflow_key(tag: str) -> str:
    """MLflow keys allow letters, digits, _ - . / and spaces."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", tag)


class WandbSink:
    """A W&B run per flashdraft run: `id` derived from the run id and `resume="allow"`, so every stage and every
    restarted pod logs into the same run. Each stage's series has its own step axis (`<stage>/step`), since W&B
    refuses a step lower than one it has seen and stages count steps differently. WANDB_PROJECT (default
    flashdraft), WANDB_ENTITY, WANDB_API_KEY, WANDB_MODE (offline: files under WANDB_DIR, `wandb sync` later)."""

    name = "wandb"

    def __init__(self, run_id: str, params: dict[str, str], prefix: str):
        import wandb

        self.prefix = prefix
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or DEFAULT_EXPERIMENT, name=run_id,
                              id=wandb_run_id(run_id), resume="allow", config=params, reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True))
        self.run.define_metric(f"{prefix}/step")
        self.run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**metrics, f"{self.prefix}/step": step})

    def artifact(self, name: str, data: bytes) -> None:
        import wandb

        with _as_file(name, data) as path:
            art = wandb.Artifact(re.sub(r"[^A-Za-z0-9_.-]", "-", f"{self.run.id}-{Path(name).stem}"), type="report")
            art.add_file(str(path), name=Path(name).name)
            self.run.log_artifact(art)

    def flush(self) -> None:
        """W&B sends in the background."""

    def close(self) -> None:
        self.run.finish()


def wandb_run_id(run_id: str) -> str:
    """A W&B run id that is the same for every task of a flashdraft run (W&B ids allow letters, digits, - _)."""
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '-', run_id)[:48]}-{digest}"
