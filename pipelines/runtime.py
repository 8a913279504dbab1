"""What the pipeline's component bodies call inside their pods (and under kfp.local).

Kept out of the component sources so the embedded code stays a few lines and this logic is importable, typed and
unit-tested like any other module. Nothing here is KFP-specific except the Metrics/HTML artifact paths it is given.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, cast

from flashdraft.components.report.summary import ReportSummary
from flashdraft.components.train.summary import StreamStats, TrainSummary
from flashdraft.config import ConfigError, RunConfig, load_config
from flashdraft.run import registry
from flashdraft.run.runner import check_run, run_task, task_fingerprint
from flashdraft.run.stage import StageSummary

log = logging.getLogger(__name__)


def stage_config(config_yaml: str, overrides: dict[str, Any] | None) -> RunConfig:
    """The run config a component works with: the YAML parameter plus the UI's dotted overrides."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(config_yaml)
        return load_config(path, overrides=dict(overrides or {}))


def check_compiled_shape(cfg: RunConfig, compiled_mode: str, compiled_num_nodes: int,
                         compiled_evaluate_only: bool = False, compiled_features_from: bool = False,
                         compiled_responses: str = "target") -> None:
    """The DAG was built for one mode, one training launcher, with or without its training tasks, with or without
    its own prep, generate and extract (data.features_from), and with or without generate (data.responses); refuse
    a config that needs another."""
    if cfg.mode.kind != compiled_mode:
        raise ConfigError(
            f"mode.kind={cfg.mode.kind!r} but this pipeline was compiled for mode {compiled_mode!r}: recompile with "
            f"`flashdraft compile --set mode.kind={cfg.mode.kind}` (the DAG differs between modes)")
    if (cfg.training.num_nodes > 1) != (compiled_num_nodes > 1):
        raise ConfigError(
            f"training.num_nodes={cfg.training.num_nodes} but this pipeline was compiled for num_nodes="
            f"{compiled_num_nodes}: single-pod and TrainJob training are different DAGs; recompile with "
            f"`flashdraft compile --set training.num_nodes={cfg.training.num_nodes}`")
    if cfg.evaluate_only != compiled_evaluate_only:
        now = "evaluates a pretrained drafter only" if cfg.evaluate_only else "trains"
        raise ConfigError(
            f"training.max_steps={cfg.training.max_steps} with drafter.init={cfg.drafter.init}: this run {now}, but "
            f"the pipeline was compiled {'without' if compiled_evaluate_only else 'with'} its generate, extract and "
            "train tasks; recompile with the same drafter.init and training.max_steps")
    if cfg.data.responses != compiled_responses:
        raise ConfigError(
            f"data.responses={cfg.data.responses} but this pipeline was compiled for data.responses="
            f"{compiled_responses} ({'without' if compiled_responses == 'dataset' else 'with'} a generate task); "
            f"recompile with `flashdraft compile --set data.responses={cfg.data.responses}`")
    if (cfg.data.features_from is not None) != compiled_features_from:
        raise ConfigError(
            f"data.features_from={cfg.data.features_from}: the pipeline was compiled "
            f"{'without' if compiled_features_from else 'with'} its own prep, generate and extract tasks; recompile "
            "with data.features_from set as this run sets it (set or unset)")


def to_json(summary: StageSummary) -> str:
    """A task's output parameter: the summary without its bulky fields (StageSummary.handoff)."""
    return json.dumps(summary.handoff(), sort_keys=True, default=str)


def plan_gate(config_yaml: str, overrides: dict[str, Any] | None, compiled_mode: str, compiled_num_nodes: int,
              compiled_evaluate_only: bool, compiled_features_from: bool, metrics: Any,
              compiled_responses: str = "target") -> str:
    """The plan task, refusing first a config that needs another DAG or a change no committed stage can carry on
    from (`check_run`), so a refused run stops here, before any GPU stage."""
    cfg = stage_config(config_yaml, overrides)
    plan = registry.current().get("plan")

    def body() -> StageSummary | dict[str, Any]:
        check_compiled_shape(cfg, compiled_mode, compiled_num_nodes, compiled_evaluate_only, compiled_features_from,
                             compiled_responses)
        check_run(cfg)
        return plan.run(cfg)

    return to_json(run_task(cfg, "plan", body=body, metrics=metrics))


def prep_shards(config_yaml: str, overrides: dict[str, Any] | None) -> list[int]:
    """The prep task; its shard ids drive the per-shard fan-outs."""
    summary = run_task(stage_config(config_yaml, overrides), "prep")
    return list(range(int(summary.num_shards)))


def trainjob_task(config_yaml: str, overrides: dict[str, Any] | None, metrics: Any, **placement: Any) -> str:
    """Multi-node training: create the TrainJob, wait for it, and return its final status as the train summary
    (raises if it failed)."""
    from flashdraft.pipelines.trainjob import launch_and_wait

    cfg = stage_config(config_yaml, overrides)

    def body() -> dict[str, Any]:
        """Runs under the train task's lease, after the runner's checks: the job carries the fingerprint the
        runner records (the same inputs, read the same way), which decides whether a retry may adopt it."""
        fingerprint = task_fingerprint(cfg, "train").digest
        return launch_and_wait(cfg, fingerprint=fingerprint, config_yaml=config_yaml, overrides=overrides,
                               **placement)

    return to_json(run_task(cfg, "train", body=body, metrics=metrics))


class WindowMonitor(threading.Thread):
    """Samples the committed feature parts in the store: peak bytes/parts held at once, and every part ever seen
    (its bytes summed = bytes produced). Parts stay until trained on `mode.reuse` times, so sampling every
    `interval_s` sees each of them. A listing that fails past the store's retry budget is counted
    (`failed_listings`) and the monitor carries on: the figures are a watch on the run, not part of it, and a
    dead thread would freeze them for the rest of the run."""

    def __init__(self, cfg: RunConfig, interval_s: float = 0.1):
        super().__init__(daemon=True, name="window-monitor")
        from flashdraft.storage.store import open_store

        self.store, self.interval_s = open_store(cfg.storage, cfg.run_id), interval_s
        self.peak_bytes = self.peak_parts = self.failed_listings = 0
        self.seen: dict[str, int] = {}
        self._halt = threading.Event()

    def sample(self) -> None:
        from flashdraft.features.window import stored_parts

        parts = stored_parts(self.store)
        self.seen.update(parts)
        self.peak_bytes = max(self.peak_bytes, sum(parts.values()))
        self.peak_parts = max(self.peak_parts, len(parts))

    def run(self) -> None:
        from flashdraft.storage.store import StoreError

        while not self._halt.is_set():
            try:
                self.sample()
            except FileNotFoundError:  # a part deleted between listing and reading its record
                pass
            except (StoreError, OSError) as exc:  # the store past its retry budget (or refusing): count, go on
                self.failed_listings += 1
                log.warning("window monitor: listing the window failed (%s: %s); %d failed so far, watching on",
                            type(exc).__name__, exc, self.failed_listings)
            self._halt.wait(self.interval_s)

    def stop(self) -> dict[str, int]:
        self._halt.set()
        self.join()
        return {"produced_bytes": sum(self.seen.values()), "produced_parts": len(self.seen),
                "peak_stored_bytes": self.peak_bytes, "peak_stored_parts": self.peak_parts,
                "failed_listings": self.failed_listings}


def _watch_producer(producer: subprocess.Popen, cfg: RunConfig, stopping: threading.Event) -> threading.Thread:
    """A producer killed hard (OOM, SIGKILL) leaves no marker; its exit status becomes the FAILED marker so the
    trainer stops with the cause instead of waiting for parts that will never come. Not when this process
    stopped it (`stopping`): then the trainer is already done or failed with its own error."""
    from flashdraft.features.window import WindowProducer
    from flashdraft.storage.store import open_store

    def watch() -> None:
        rc = producer.wait()
        if rc != 0 and not stopping.is_set():
            WindowProducer(open_store(cfg.storage, cfg.run_id), cfg.mode).fail(
                f"extraction producer process exited with status {rc}")

    thread = threading.Thread(target=watch, daemon=True, name="producer-watch")
    thread.start()
    return thread


def train_with_producers(cfg: RunConfig) -> TrainSummary:
    """Local streaming: extraction producers in a background process, the trainer in this one, concurrently.

    The producer process extracts every shard through `run_extract` (the code a cluster extract pod runs), waiting
    whenever the bounded window is full; a producer failure (even a hard kill) becomes the window's FAILED marker,
    so the trainer stops with the cause; a trainer failure stops the producer. A monitor records produced vs peak
    stored bytes (metrics/stream.json).
    """
    from flashdraft.components.train.launch import launch_training, write_config
    from flashdraft.features import window
    from flashdraft.storage import layout
    from flashdraft.storage.store import open_store

    # Two torch processes share the cores: split the thread budget (oversubscribed OpenMP threads spin and crawl).
    # The budget is the node's (num_threads a rank x nproc_per_node ranks); the producer process gets half of it.
    ranks = cfg.training.nproc_per_node
    budget = cfg.training.num_threads * ranks if cfg.training.num_threads else os.cpu_count() or 2
    producer_cfg = cfg.with_overrides({"training.num_threads": max(1, budget // 2 // ranks)})
    cfg = cfg.with_overrides({"training.num_threads": max(1, (budget - budget // 2) // ranks)})
    # A restarted pair (after a kill or a failure) starts both sides afresh: markers left by the previous attempt
    # (a producer FAILED, a consumer STOP) would end the new one at once.
    store = open_store(cfg.storage, cfg.run_id)
    for stale in (layout.STREAM_FAILED, layout.STREAM_STOP):
        if store.exists(stale):
            log.info("streaming: clearing %s from a previous attempt", stale)
            store.delete(stale)
    monitor = WindowMonitor(cfg)
    monitor.start()
    with tempfile.TemporaryDirectory() as tmp:
        producer = subprocess.Popen([sys.executable, "-m", "flashdraft.pipelines.producers",
                                     write_config(producer_cfg, tmp)])
        stopping = threading.Event()
        watcher = _watch_producer(producer, cfg, stopping)
        try:
            summary = launch_training(cfg)
        except BaseException:
            stopping.set()
            producer.terminate()
            watcher.join(timeout=60)
            monitor.stop()
            raise
        store = open_store(cfg.storage, cfg.run_id)
        # The trainer may finish first (training.max_steps): a producer still waiting for room would wait forever.
        stopped_early = producer.poll() is None and not store.exists(layout.STREAM_EOS)
        if stopped_early:
            stopping.set()
            log.info("streaming: the trainer finished before the producers; stopping them")
            window.WindowConsumer(store).stop("the trainer finished (training.max_steps reached)")
        watcher.join()
    stats = StreamStats(**monitor.stop(), window_bytes=cfg.mode.window_bytes, window_shards=cfg.mode.window_shards,
                        reuse=cfg.mode.reuse, stopped_early=stopped_early)
    store.commit_json(layout.metrics_key("stream"), stats.model_dump(mode="json"))
    if producer.returncode != 0 and not stopped_early:
        raise RuntimeError(f"streaming extraction producers exited with status {producer.returncode}")
    log.info("streaming: produced %d bytes in %d parts; peak stored %d bytes (window %d); %d failed listings",
             stats.produced_bytes, stats.produced_parts, stats.peak_stored_bytes, cfg.mode.window_bytes,
             stats.failed_listings)
    return summary.model_copy(update={"streaming": stats})


def write_report(cfg: RunConfig, state: str, error: str, html_path: str, md_path: str, metrics: Any = None) -> str:
    """Exit handler body: the run report (whatever stages ran), copied into the task's HTML/Markdown artifacts, and
    every stage's state and figures (report/metrics.json) as this step's KFP Metrics."""
    from flashdraft.components.report.report import run_report

    header = f"# flashdraft run `{cfg.run_id}`: {state}\n\n" + (f"Error: {error}\n\n" if error else "")

    def body() -> ReportSummary:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = run_report(cfg, out_dir=tmp, run_over=True)
            except Exception as exc:  # the summary of a failed run must still be written
                log.exception("report failed; writing the status summary only")
                result = ReportSummary(report_error=f"{type(exc).__name__}: {exc}")
            md = header + _read_text(result.markdown_path)
            html = _read_text(result.html_path) or f"<pre>{md}</pre>"
        Path(md_path).write_text(md)
        Path(html_path).write_text(html)
        return result

    result = cast(ReportSummary, run_task(cfg, "report", body=body))  # body's own model, passed through
    if metrics is not None:
        for key, value in result.metrics.items():
            metrics.log_metric(key, float(value))
    out = result.model_dump(mode="json", exclude_unset=True, exclude={"markdown_path", "html_path"})
    return json.dumps({"state": state, "error": error, **out}, sort_keys=True, default=str)


def _read_text(path: str | None) -> str:
    return Path(path).read_text() if path and os.path.exists(path) else ""
