"""`flashdraft run-local`: the same pipeline under kfp.local on this machine, with a local object store.

kfp.local's SubprocessRunner runs each component body in a subprocess of the current Python (use_venv=False, so
the installed flashdraft is used and nothing is downloaded) and ignores every Kubernetes setting. Two deliberate
differences from a cluster run: shards go one at a time (parallelism=1; 2 cores), and streaming mode runs the
extraction producers inside the train task and GPU counts are literals (see `build_pipeline(local=True)`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from flashdraft.config import RunConfig

log = logging.getLogger(__name__)


def localize(cfg: RunConfig) -> RunConfig:
    """A file:// store root made absolute: component subprocesses must agree on where the store is."""
    root = cfg.storage.root
    if root.startswith("file://") or "://" not in root:
        path = Path(root.removeprefix("file://")).expanduser().resolve()
        return cfg.with_overrides({"storage.root": f"file://{path}"})
    return cfg


def _hide_shadowing_docker() -> None:
    """kfp.local imports docker-py when it is importable. Run from the repo root (`python -m pytest`), this repo's
    `docker/` folder (Dockerfiles) is importable as a namespace package named `docker`, and kfp then fails with
    an AttributeError; mark it unimportable so kfp takes its documented no-docker path."""
    spec = importlib.util.find_spec("docker") if "docker" not in sys.modules else None
    if spec is not None and spec.origin in (None, "namespace"):
        sys.modules["docker"] = None  # type: ignore[assignment]


def run_local(cfg: RunConfig, workdir: str) -> dict[str, Any]:
    """Run the pipeline with kfp.local; returns state, error, report path, tau, planned vs stored bytes."""
    _hide_shadowing_docker()
    from flashdraft.pipelines.pipeline import build_pipeline
    from kfp import local

    cfg = localize(cfg)
    root = Path(workdir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    pipeline = build_pipeline(cfg, local=True, parallelism=1)
    state, error = "SUCCEEDED", ""
    t0 = time.monotonic()
    try:
        pipeline(config_yaml=json.dumps(cfg.model_dump(mode="json")), overrides={})
    except Exception as exc:  # kfp.local raises on a failed task after the exit handler ran
        state, error = "FAILED", f"{type(exc).__name__}: {exc}"
    result = {"state": state, "error": error, "wall_s": round(time.monotonic() - t0, 1), "mode": cfg.mode.kind,
              **outcome(cfg)}
    log.info("run-local %s in %.0f s", state, result["wall_s"])
    return result


def outcome(cfg: RunConfig) -> dict[str, Any]:
    """What a finished run left in the store: report path, tau, planned vs stored feature bytes."""
    from flashdraft import layout
    from flashdraft.features.manifest import committed_parts
    from flashdraft.store import open_store

    store = open_store(cfg.storage, cfg.run_id)
    out: dict[str, Any] = {"store": store.root}

    def metrics(stage: str) -> dict[str, Any]:
        key = layout.metrics_key(stage)
        return store.get_json_verified(key) if store.is_committed(key) else {}

    plan, evaluation, stream = metrics("plan"), metrics("evaluate"), metrics("stream")
    out["tau"] = evaluation.get("drafter", {}).get("tau")
    out["baseline_tau"] = evaluation.get("baseline", {}).get("tau")
    out["planned_bytes"] = plan.get("peak_bytes_streaming" if cfg.mode.kind == "streaming" else
                                    "total_bytes_at_rest")
    parts = committed_parts(store)
    out["stored_bytes"] = sum(store.size(k) for k in parts)
    out["stored_parts"] = len(parts)
    if stream:
        out["streaming"] = stream
    report_key = f"{layout.REPORTS}/report.html"
    if store.exists(report_key):
        url = store.url(report_key)
        out["report"] = urlparse(url).path if url.startswith("file://") else url
    return out
