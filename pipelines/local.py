"""`flashdraft run-local`: the same pipeline under kfp.local on this machine, with a local object store.

kfp.local's SubprocessRunner runs each component body in a subprocess of the current Python (use_venv=False, so
the installed flashdraft is used and nothing is downloaded) and ignores every Kubernetes setting. Two deliberate
differences from a cluster run: shards go one at a time (parallelism=1; 2 cores), and streaming mode runs the
extraction producers inside the train task and GPU counts are literals (see `build_pipeline(local=True)`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from pydantic import BaseModel

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.components.plan.summary import PlanSummary
from flashdraft.components.train.summary import StreamStats, TrainSummary
from flashdraft.config import RunConfig
from flashdraft.pipelines.containers import ContainerRun

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def localize(cfg: RunConfig) -> RunConfig:
    """A file:// store root (and data.features_from) made absolute: component subprocesses must agree on where
    the stores are."""
    out = {}
    for field, uri in (("storage.root", cfg.storage.root), ("data.features_from", cfg.data.features_from)):
        if uri is not None and (uri.startswith("file://") or "://" not in uri):
            out[field] = f"file://{Path(uri.removeprefix('file://')).expanduser().resolve()}"
    return cfg.with_overrides(out) if out else cfg


def _hide_shadowing_docker() -> None:
    """kfp.local imports docker-py when it is importable. Run from the repo root (`python -m pytest`), this repo's
    `docker/` folder (Dockerfiles) is importable as a namespace package named `docker`, and kfp then fails with
    an AttributeError; mark it unimportable so kfp takes its documented no-docker path."""
    spec = importlib.util.find_spec("docker") if "docker" not in sys.modules else None
    if spec is not None and spec.origin in (None, "namespace"):
        sys.modules["docker"] = None  # type: ignore[assignment]


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """Environment for the component subprocesses kfp.local starts (they inherit this process's environment)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _kfp_output_to(path: Path) -> Iterator[None]:
    """kfp.local's own output into `path`: it prints each task's piped output and its executor dump with print()
    and logs through the root logger onto sys.stdout (`kfp.local.logging_utils.local_logger_context` builds its
    handler from sys.stdout on every task), so redirecting sys.stdout/stderr and the root logger's handlers for
    the duration of the run catches all of it, and nothing of kfp is patched."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    with open(path, "a", buffering=1, encoding="utf-8") as f:
        handler = logging.StreamHandler(f)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.handlers = [handler]
        root.setLevel(logging.INFO)
        try:
            with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
                yield
        finally:
            root.handlers, _ = saved
            root.setLevel(saved[1])


def run_local(cfg: RunConfig, workdir: str, *, console: Any = None, verbose: bool = False,
              from_stage: str | None = None, exports_dir: str | Path = "exports",
              container: ContainerRun | None = None, confirm_readers: bool = False,
              variants: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run the pipeline with kfp.local; returns state, error, the failed task, stage states, report path, tau,
    planned vs stored bytes, the local export folders and the log folder. Raises StageInputsChanged before anything
    runs when a committed stage cannot carry on from the changed settings (flashdraft/run/runner.py).

    exports_dir: committed export folders are copied to `exports_dir/<run_id>/<format>/`. console: a rich Console
    for the live view (None shows nothing); verbose: also leave kfp's and every task's output on the terminal.
    from_stage: recompute that stage and every later one (their committed results are deleted first; results
    other runs read need confirm_readers). container:
    run every task in its pool's image under kfp.local's DockerRunner (pipelines/containers.py), engine, images
    and versions checked first. variants: the sweep pipeline a cluster runs (pipelines/sweep.py
    `pipeline_variants`), one kfp.local run (`flashdraft sweep` runs the variants as runs of their own instead)."""
    _hide_shadowing_docker()
    from kfp import local

    from flashdraft.cli.console import ConsoleView
    from flashdraft.pipelines.pipeline import build_pipeline
    from flashdraft.run.events import LOG_DIR_ENV, TASK_LOGS_ENV
    from flashdraft.run.runner import check_run, clear_from

    # images first: a missing engine or image must not cost a --from its cleared results
    version = container.preflight() if container is not None else None
    cfg = localize(cfg)
    if from_stage:
        cleared = clear_from(cfg, from_stage, confirm_readers=confirm_readers)
        if console is not None:
            console.print(f"--from {from_stage}: recomputing {', '.join(cleared)}", highlight=False, markup=False)
    check_run(cfg)
    root = Path(workdir).expanduser().resolve()
    log_dir = root / "logs" / f"{cfg.run_id}-{time.strftime('%Y%m%d-%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {LOG_DIR_ENV: str(log_dir), TASK_LOGS_ENV: "0" if verbose else "1"}
    runner = local.SubprocessRunner(use_venv=False) if container is None else container.kfp_runner(cfg, root, env)
    local.init(runner=runner, pipeline_root=str(root), raise_on_error=True)
    pipeline = build_pipeline(cfg, local=True, parallelism=1, images=container.images if container else None,
                              variants=variants)
    if console is not None:
        console.print(f"flashdraft run-local: run {cfg.run_id}, mode {cfg.mode.kind}, store {cfg.storage.root}",
                      highlight=False, markup=False, soft_wrap=True)
        if container is not None:
            console.print(f"in containers ({version}): " + ", ".join(f"{pool} {image}" for pool, image in
                                                             container.images.items()),
                          highlight=False, markup=False, soft_wrap=True)
        console.print(f"logs: {log_dir}", highlight=False, markup=False, soft_wrap=True)
    view = ConsoleView(console, log_dir) if console is not None else None
    state, error = "SUCCEEDED", ""
    t0 = time.monotonic()
    quiet = contextlib.nullcontext() if verbose else _kfp_output_to(log_dir / "kfp-local.log")
    with _environ(env), quiet:
        if view is not None:
            view.start()
        try:
            pipeline(config_yaml=json.dumps(cfg.model_dump(mode="json")), overrides={})
        except Exception as exc:  # kfp.local raises on a failed task after the exit handler ran
            state, error = "FAILED", f"{type(exc).__name__}: {exc}"
        finally:
            if view is not None:
                view.stop()
    result = {"state": state, "error": error, "wall_s": round(time.monotonic() - t0, 1), "mode": cfg.mode.kind,
              "log_dir": str(log_dir), **outcome(cfg), "exports": local_exports(cfg, Path(exports_dir) / cfg.run_id)}
    log.info("run-local %s in %.0f s", state, result["wall_s"])
    return result


def local_exports(cfg: RunConfig, folder: Path) -> dict[str, str]:
    """The run's committed export folders copied (verified) to `folder/<format>/`; {} when nothing was exported.
    A failure to copy is logged, not raised: the run's own outcome stands, and the store keeps the export."""
    from flashdraft.components.export.export import download_export
    from flashdraft.storage.store import open_store

    try:
        return {fmt: str(path) for fmt, path in download_export(open_store(cfg.storage, cfg.run_id), folder).items()}
    except Exception:  # noqa: BLE001
        log.warning("could not copy the export to %s", folder, exc_info=True)
        return {}


def outcome(cfg: RunConfig) -> dict[str, Any]:
    """What a finished run left in the store: stage states and the first failed task, report path, tau, planned vs
    stored feature bytes."""
    from flashdraft.components.report.gather import stage_metrics
    from flashdraft.features.manifest import committed_parts
    from flashdraft.run.overview import stage_statuses
    from flashdraft.run.status import first_failure, read_records
    from flashdraft.storage import layout
    from flashdraft.storage.store import open_store

    store = open_store(cfg.storage, cfg.run_id)
    out: dict[str, Any] = {"store": store.root}
    statuses = stage_statuses(read_records(store), stage_metrics(store), run_over=True)
    out["statuses"], out["failure"] = statuses, first_failure(statuses)

    def metrics(model: type[M], stage: str) -> M | None:
        key = layout.metrics_key(stage)
        return model.model_validate(store.get_json_verified(key)) if store.is_committed(key) else None

    plan, evaluation = metrics(PlanSummary, "plan"), metrics(EvaluateSummary, "evaluate")
    stream = metrics(StreamStats, "stream")
    out["tau"] = evaluation.drafter.tau if evaluation and evaluation.drafter else None
    out["suites"] = evaluation.suite_table_text() if evaluation else ""
    out["verdict"] = evaluation.decoder_table_text() if evaluation else ""
    train = metrics(TrainSummary, "train")
    out["heldout"] = [(p["step"], p["tau"]) for p in train.heldout if p.get("tau") is not None] if train else []
    out["baseline_tau"] = evaluation.baseline.tau if evaluation and evaluation.baseline else None
    if plan is None:
        out["planned_bytes"] = None
    else:
        out["planned_bytes"] = plan.peak_bytes_streaming if cfg.mode.kind == "streaming" else plan.total_bytes_at_rest
    parts = committed_parts(store)
    out["stored_bytes"] = sum(store.size(k) for k in parts)
    out["stored_parts"] = len(parts)
    if stream is not None:
        out["streaming"] = stream.model_dump(mode="json")  # as committed (metrics/stream.json)
    if store.exists(layout.REPORT_HTML):
        url = store.url(layout.REPORT_HTML)
        out["report"] = urlparse(url).path if url.startswith("file://") else url
    return out


def print_outcome(console: Any, result: dict[str, Any]) -> None:
    """The end of the console: the stage table, the run's key figures, where the report and logs are, and for a
    failed run, last, the failed task, its exception and its log file."""
    from flashdraft.cli.console import summary_table
    from flashdraft.run.reporting import fmt_bytes

    def say(text: str, style: str | None = None) -> None:
        console.print(text, style=style, highlight=False, markup=False, soft_wrap=True)

    console.print(summary_table(result["statuses"]))
    stored = f"stored {fmt_bytes(result.get('stored_bytes'))} in {result.get('stored_parts', 0)} parts"
    planned = fmt_bytes(result["planned_bytes"]) if result.get("planned_bytes") else "-"
    if result.get("mode") == "streaming":  # the plan is a peak, and released parts are gone
        say(f"feature bytes: planned peak {planned}, {stored} at the end")
    else:
        say(f"feature bytes: planned {planned}, {stored}")
    if stream := result.get("streaming"):
        say(f"streaming: produced {fmt_bytes(stream['produced_bytes'])} in {stream['produced_parts']} parts, peak "
            f"stored {fmt_bytes(stream['peak_stored_bytes'])} in {stream['peak_stored_parts']} parts (window "
            f"{fmt_bytes(stream['window_bytes'])}, {stream['window_shards']} parts)")
    if result.get("suites"):
        say("evaluation suites:\n" + result["suites"])
    if result.get("heldout"):
        say("held-out offline tau during training (step:tau): "
            + " ".join(f"{step}:{tau:.2f}" for step, tau in result["heldout"]))
    for fmt, folder in (result.get("exports") or {}).items():
        say(f"drafter ({fmt}, serve the folder as is; its README.md has the command): {folder}")
    if result.get("verdict"):  # every decoder side by side, then which to serve per suite
        say("does training pay? every decoder on every suite:\n" + result["verdict"])
    say(f"report: {result.get('report') or 'not written'}")
    say(f"logs: {result['log_dir']} (kfp-local.log: kfp's own output; <task>.log: each task's)")
    if result["state"] == "SUCCEEDED":
        say(f"run-local succeeded in {result['wall_s']:.0f} s", "bold green")
        return
    failure = result.get("failure")
    if failure is not None:
        say(f"FAILED: {failure.label}: {failure.failure()}", "bold red")
        say(f"log: {failure.log or result['log_dir']}", "red")
    else:  # no task recorded a failure (kfp itself failed): its own message and log
        say(f"FAILED: {result['error']}", "bold red")
        say(f"log: {Path(result['log_dir']) / 'kfp-local.log'}", "red")
