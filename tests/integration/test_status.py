"""`flashdraft status --run URI`: stage-by-stage state of a run from its committed records, on file:// and on a
real S3 server, as a person who did not start the run would ask for it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.config import load_config
from flashdraft.pipelines import runtime
from flashdraft.run.overview import stage_statuses
from flashdraft.run.runner import run_task
from flashdraft.run.status import StageRecord, now, status_key
from flashdraft.storage.store import open_store

pytestmark = pytest.mark.integration


def _half_run(cfg) -> None:
    """prep done, generate shard 0 done and shard 1 failed, extract shard 0 still running (no end recorded)."""
    run_task(cfg, "prep", body=lambda: {"kept": 30, "num_train": 26, "num_eval": 4, "quarantined": 2})
    run_task(cfg, "generate", body=lambda: {"samples": 13, "generated_tokens": 390, "generation_seconds": 3.0},
                      shard=0)

    def boom() -> dict:
        raise RuntimeError("vLLM engine died: CUDA error: an illegal memory access")

    with pytest.raises(RuntimeError):
        run_task(cfg, "generate", body=boom, shard=1)
    store = open_store(cfg.storage, cfg.run_id)
    store.commit_json(status_key("extract", 0), StageRecord(
        stage="extract", shard=0, state="running", started=now(), attempt=2,
        log="pod flashdraft-x-extract-1: kubectl logs flashdraft-x-extract-1 -c main").model_dump(mode="json"))


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_status_reads_any_store(backend, tmp_path, request):
    if backend == "s3":
        storage = request.getfixturevalue("s3_storage")
        overrides = {"storage.root": storage.root, "storage.endpoint_url": storage.endpoint_url}
    else:
        overrides = {"storage.root": f"file://{tmp_path}/runs"}
    cfg = load_config(preset="tiny", overrides=overrides)
    _half_run(cfg)
    uri = open_store(cfg.storage, cfg.run_id).root
    args = ["status", "--run", uri] + (["--endpoint-url", cfg.storage.endpoint_url] if backend == "s3" else [])
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    row = {line.split("│")[1].strip(): line for line in lines if line.count("│") >= 4}
    assert "done" in row["prep"] and "30 prompts kept, 2 quarantined" in row["prep"]
    assert "failed" in row["generate"] and "not run" in row["train"] and "not run" in row["export"]
    assert "running" in row["extract"]
    assert "generate shard 1 failed: RuntimeError: vLLM engine died: CUDA error: an illegal memory access" in out.output
    assert "extract shard 0 running since" in out.output and "kubectl logs flashdraft-x-extract-1" in out.output
    # no writer holds its lease (the record says running, its pod is gone): the line says what to do
    assert "no writer holds its lease: it was interrupted; resubmit the run (or Retry) to resume it" in out.output

    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    by_stage = {s["stage"]: s for s in data}
    assert [s["stage"] for s in data] == ["plan", "prep", "generate", "extract", "train", "evaluate", "export"]
    assert by_stage["generate"]["state"] == "failed" and by_stage["plan"]["state"] == "not run"
    assert by_stage["generate"]["tasks"][1]["error_type"] == "RuntimeError"
    assert by_stage["extract"]["tasks"][0]["attempt"] == 2


def test_stage_states_combine_shards_and_count_hand_run_stages(tmp_path):
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs"})
    for shard, (samples, tokens, secs) in enumerate([(10, 300, 3.0), (12, 500, 2.0)]):
        run_task(cfg, "generate", body=lambda s=samples, t=tokens, x=secs: {
            "samples": s, "generated_tokens": t, "generation_seconds": x}, shard=shard)
    store = open_store(cfg.storage, cfg.run_id)
    from flashdraft.run.status import read_records

    statuses = {s.stage: s for s in stage_statuses(read_records(store), ["train"])}
    gen = statuses["generate"]
    assert gen.state == "done" and gen.figures["samples"] == 22 and gen.figures["tokens_per_s"] == 160.0
    assert gen.headline == "22 samples, 800 tokens, 160.0 tokens/s"
    assert statuses["train"].state == "done", "metrics without a record: run by hand with `flashdraft train`"
    assert statuses["extract"].state == "not run"
    run_task(cfg, "generate", body=lambda: {"samples": 10, "generated_tokens": 300, "generation_seconds": 3.0},
                      shard=0)
    again = [r for r in read_records(store) if r.shard == 0][0]
    assert again.attempt == 2, "a rerun of a task counts its attempts"


def test_step_metrics_and_the_exit_handler_artifacts_carry_the_same_states_and_figures(tmp_path):
    """What the Kubeflow UI shows without opening logs: each step's Metrics (its figures and duration) and the
    report step's HTML/Markdown/Metrics (every stage's state and figures), as the component bodies write them."""
    from kfp.dsl import Metrics

    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs"})
    step = Metrics()
    run_task(cfg, "generate", body=lambda: {"samples": 13, "generated_tokens": 390, "generation_seconds": 3.0},
                      shard=0, metrics=step)
    assert step.metadata["samples"] == 13 and step.metadata["tokens_per_s"] == 130.0
    assert step.metadata["duration_s"] >= 0
    _half_run(cfg)
    exit_metrics, html, md = Metrics(), tmp_path / "report.html", tmp_path / "summary.md"
    out = json.loads(runtime.write_report(cfg, "FAILED", "Task generate failed.", str(html), str(md), exit_metrics))
    assert out["stages"]["generate"].startswith("failed: RuntimeError: vLLM engine died")
    assert out["stages"]["extract"].startswith("failed: "), "still running when the run ended: died unrecorded"
    assert exit_metrics.metadata["generate_state"] == -1.0 and exit_metrics.metadata["train_state"] == 0.0
    assert exit_metrics.metadata["prep_state"] == 1.0 and exit_metrics.metadata["prep_prompts_kept"] == 30.0
    summary = md.read_text()
    assert summary.startswith(f"# flashdraft run `{cfg.run_id}`: FAILED")
    assert "| generate | failed: RuntimeError: vLLM engine died" in summary and "| export | not run |" in summary
    assert "<tr class='failed'><td>generate</td>" in html.read_text()


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_status_on_a_path_without_a_run_says_so_and_lists_the_runs(backend, tmp_path, request, monkeypatch):
    """The store root instead of a run (`status --run file://./runs`, an easy mistake), a run that has not
    started, and no run at all: one line naming the runs below, non-zero exit, never a table of "not run"."""
    if backend == "s3":
        storage = request.getfixturevalue("s3_storage")
        overrides = {"storage.root": storage.root, "storage.endpoint_url": storage.endpoint_url}
        endpoint = ["--endpoint-url", storage.endpoint_url]
    else:
        overrides, endpoint = {"storage.root": f"file://{tmp_path}/runs"}, []
    cfg = load_config(preset="tiny", overrides=overrides)
    run_task(cfg, "prep", body=lambda: {"kept": 30, "num_train": 26, "num_eval": 4, "quarantined": 2})
    root = overrides["storage.root"]
    out = CliRunner().invoke(app, ["status", "--run", root, *endpoint], terminal_width=400)
    assert out.exit_code == 1, out.output
    assert out.output.strip() == (f"no run at {root}: no task records (status/) or metrics (metrics/) committed "
                                  f"there; runs under {root}: tiny (flashdraft status --run {root}/tiny)")
    report = CliRunner().invoke(app, ["report", "--run", root, *endpoint], terminal_width=400)
    assert report.exit_code == 1 and f"(flashdraft report --run {root}/tiny)" in report.output
    assert not open_store(cfg.storage).list("reports/"), "no report of nothing committed at the root"
    not_started = CliRunner().invoke(app, ["status", "--preset", "tiny-qwen35", *(
        f"--set={k}={v}" for k, v in overrides.items())], terminal_width=400)
    assert not_started.exit_code == 1 and f"no run at {root}/tiny-qwen35" in not_started.output
    assert f"runs under {root}: tiny" in not_started.output
    if backend == "file":  # no run given: the runs in the default store root (./runs), as run-local writes them
        monkeypatch.chdir(tmp_path)
        bare = CliRunner().invoke(app, ["status"], terminal_width=400)
        assert bare.exit_code == 2 and "pass --run RUN_URI" in bare.output
        assert "runs under file://./runs: tiny" in bare.output
