"""What the pipeline's component bodies call inside their pods (and under kfp.local).

Kept out of the component sources so the embedded code stays a few lines and this logic is importable, typed and
unit-tested like any other module. Nothing here is KFP-specific except the Metrics/HTML artifact paths it is given.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from flashdraft.config import ConfigError, RunConfig, dump_config, load_config

log = logging.getLogger(__name__)


def stage_config(config_yaml: str, overrides: dict[str, Any] | None) -> RunConfig:
    """The run config a component works with: the YAML parameter plus the UI's dotted overrides."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(config_yaml)
        return load_config(path, overrides=dict(overrides or {}))


def check_compiled_shape(cfg: RunConfig, compiled_mode: str, compiled_num_nodes: int) -> None:
    """The DAG was built for one mode and one training launcher; refuse a config that needs another."""
    if cfg.mode.kind != compiled_mode:
        raise ConfigError(
            f"mode.kind={cfg.mode.kind!r} but this pipeline was compiled for mode {compiled_mode!r}: recompile with "
            f"`flashdraft compile --set mode.kind={cfg.mode.kind}` (the DAG differs between modes)")
    if (cfg.training.num_nodes > 1) != (compiled_num_nodes > 1):
        raise ConfigError(
            f"training.num_nodes={cfg.training.num_nodes} but this pipeline was compiled for num_nodes="
            f"{compiled_num_nodes}: single-pod and TrainJob training are different DAGs; recompile with "
            f"`flashdraft compile --set training.num_nodes={cfg.training.num_nodes}`")


def to_json(summary: dict[str, Any]) -> str:
    return json.dumps(summary, sort_keys=True, default=str)


def finish(summary: dict[str, Any], metrics: Any) -> str:
    """Log the summary's top-level numbers as KFP metrics (shown in the UI) and return it as JSON."""
    for key, value in summary.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics.log_metric(key, float(value))
    return to_json(summary)


def _write_config(cfg: RunConfig, folder: str) -> str:
    path = os.path.join(folder, "config.yaml")
    Path(path).write_text(dump_config(cfg))
    return path


def _flashdraft_cmd() -> list[str]:
    exe = shutil.which("flashdraft")
    return [exe] if exe else [sys.executable, "-m", "flashdraft.cli"]


def train_in_pod(cfg: RunConfig) -> dict[str, Any]:
    """Train in this pod: in-process for one rank; through `flashdraft train` (which re-launches itself under
    torchrun --nproc_per_node) for several GPUs."""
    if cfg.training.nproc_per_node <= 1:
        from flashdraft.components.train.trainer import run_train

        return run_train(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*_flashdraft_cmd(), "train", "--config", _write_config(cfg, tmp)], check=True)
    from flashdraft import layout
    from flashdraft.store import open_store

    return open_store(cfg.storage, cfg.run_id).get_json_verified(layout.metrics_key("train"))


def train_with_producers(cfg: RunConfig) -> dict[str, Any]:
    """Local streaming: extraction producers in a background process, the trainer in this one, concurrently.

    The producer process runs `flashdraft extract --shard K` for every shard (the same CLI a cluster pod runs); it
    waits whenever the bounded window is full. If it fails, the window gets a failure marker so the trainer stops
    with a clear error instead of waiting forever; if the trainer fails, the producer is stopped.
    """
    from flashdraft.features import window

    with tempfile.TemporaryDirectory() as tmp:
        config_path = _write_config(cfg, tmp)
        producer = subprocess.Popen([sys.executable, "-m", "flashdraft.pipelines.producers", config_path])
        try:
            summary = train_in_pod(cfg)
        except BaseException:
            producer.terminate()
            producer.wait(timeout=60)
            raise
        rc = producer.wait()
        if rc != 0:
            raise RuntimeError(f"streaming extraction producers exited with status {rc}")
    summary["streaming"] = window.window_stats(cfg)
    return summary


def run_trainjob(cfg: RunConfig, **kwargs: Any) -> dict[str, Any]:
    """Create the multi-node TrainJob, wait for it, return its final status (raises if it failed)."""
    from flashdraft.pipelines.trainjob import launch_and_wait

    return launch_and_wait(cfg, **kwargs)


def write_report(cfg: RunConfig, state: str, error: str, html_path: str, md_path: str) -> str:
    """Exit handler body: the run report (always), copied into the task's HTML/Markdown artifacts."""
    from flashdraft.components.evaluate.report import run_report

    try:
        paths = run_report(cfg)
    except Exception as exc:  # a failed run may lack what the full report needs: still leave a summary
        log.exception("report failed; writing the status summary only")
        paths = {"error": f"{type(exc).__name__}: {exc}"}
    status_md = f"# flashdraft run `{cfg.run_id}`: {state}\n\n" + (f"Error: {error}\n" if error else "")
    md = status_md + _read_text(paths.get("summary_md"))
    Path(md_path).write_text(md)
    Path(html_path).write_text(_read_text(paths.get("report_html")) or f"<pre>{md}</pre>")
    return to_json({"state": state, "error": error, **paths})


def _read_text(path: str | None) -> str:
    return Path(path).read_text() if path and os.path.exists(path) else ""
