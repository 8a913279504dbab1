"""The user-path tier: every command README.md and docs/ show in a ```bash block works as written, so the docs
cannot rot silently.

The commands are read from README.md, then docs/*.md in name order (tests/support/user_path.py). Each one is either
run here, by bash in a clean copy of the repository that shares the installed venv, exactly as written and in the
docs' order, or listed in NOT_HERE, the one place that says why a command cannot run in this suite (a cluster, a
registry, a GPU, the network, or a long real-model run). A newly documented command is run by default; a NOT_HERE
entry whose command left the docs fails the test.

docs/local-run.md starts the local runs and then inspects them (status, report, export, features verify), so its
commands run in their own test after its runs. The tiny `run-local` is also the console test: its output stays
within the stated bound and holds each stage's line with its headline figures and the final summary, and no kfp
executor dump. Its streaming example must really exercise the window: bytes produced above the window, peak stored
within it and below produced.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.shared_runs import CONSOLE_MAX_BYTES, CONSOLE_MAX_LINES
from support.user_path import DocCommand, Ran, doc_commands, run_as_user

from flashdraft.storage.store import open_store

# Command prefix -> why this suite does not run it.
NOT_HERE = {
    "make run-local": "the real 135M chat model end to end, 7 min on a quiet 2-core machine (run by hand; "
                      "the tiny run-local below takes the same path)",
    "make test": "the test suite itself",
    "flashdraft status --run s3://my-bucket/": "a cluster run's S3 store (the same command on a real S3 server: "
                                               "tests/integration/test_status.py)",
    ".venv/bin/flashdraft run-local --preset smollm2-quality": "the real 135M chat model on all demo prompts, ~16 min "
                                                               "on a quiet 2-core machine (run by hand)",
    ".venv/bin/flashdraft run-local --preset qwen3.6-27b-rehearsal": "the full-width rehearsal, ~20 min and ~17 GB "
                                                                     "on a quiet 2-core machine (run by hand; its "
                                                                     "production-shape paths run at CI size in "
                                                                     "tests/integration/test_rehearsal.py)",
    "make images push": "docker builds and a registry push",
    "make images REGISTRY=": "docker builds behind a proxy (the containers tier builds the images with these build "
                             "args: tests/containers)",
    "flashdraft run-local --preset tiny --runner docker": "a Docker engine and the built image (the containers tier "
                                                          "runs it: tests/containers/test_images.py)",
    "make test-containers": "the containers tier itself (.ci/run runs it)",
    "make helm-install": "a Kubernetes cluster (tests/k8s installs the chart into a real API server where one is "
                         "provided; tests/integration/test_cluster_contract.py checks what it renders without one)",
    "export KFP_HOST=": "a shell assignment for the cluster commands below it",
    "export KFP_BEARER_TOKEN=": "kubectl against a cluster",
    "make submit-pipeline PARAMS=": "a KFP API server (the dry run below runs here; the requests are tested in "
                                    "tests/unit/test_submit_fake_kfp_api.py)",
    "flashdraft extract --preset smollm2-local": "needs generate's responses for the run first (a pipeline step); "
                                                 "extraction is tested in tests/unit/test_extract.py",
    "flashdraft features verify --preset smollm2-local": "needs that extraction first (docs/local-run.md verifies "
                                                         "the tiny run's features as written)",
    "flashdraft train --preset smollm2-local": "needs the run's features first; training is tested in "
                                               "tests/integration/test_train.py",
    "flashdraft train --preset qwen3.6-27b": "8 GPUs and the 27B target",
    "make bench": "minutes of benchmarks (benchmarks/)",
    ".venv/bin/python benchmarks/bench_train.py": "minutes of training per recipe, and the speculators side needs the "
                                                  "bench venv (`make bench-venv`)",
    "vllm serve": "vLLM on a GPU with the real target",
    "flashdraft run-local --preset tiny --set drafter.kind=dflash2": "a second whole tiny run; DFlash2's train, "
                                                                    "evaluate and export paths are tested in "
                                                                    "tests/unit/test_dflash2.py and tests/vllm",
    "python3 benchmarks/gpu_check": "a CUDA GPU (its CPU half and a toy-width dry run of the production section "
                                    "are tests/unit/test_gpu_check.py)",
    "make gpu-wheels": "downloads the wheels a bare GPU machine lacks (`make gpu-e2e-dry` runs the script without "
                       "them: tests/integration/test_gpu_e2e_dry.py)",
    "FLASHDRAFT_COMMIT=<sha> python3 benchmarks/gpu_e2e": "a CUDA GPU (its CPU dry run is "
                                                          "tests/integration/test_gpu_e2e_dry.py)",
    "python -m sglang.launch_server": "SGLang on a GPU with the real target",
    "flashdraft run-local --preset smollm2-local --set run_id=replies-": "two real-model runs on the user's own "
                                                                          "conversations file (the tiny dataset-"
                                                                          "replies run is tests/integration/"
                                                                          "test_dataset_responses_run.py)",
    "flashdraft run-local --preset smollm2-local --set run_id=tau-": "issue 49's SmolLM2 measurement: three "
                                                                      "real-model runs on a dataset with reference "
                                                                      "replies, ~15 min (benchmarks/"
                                                                      "bench_responses.py runs them)",
    "flashdraft run-local --preset tiny --set run_id=base": "two whole tiny runs, the second reading the first's "
                                                            "features: tests/integration/test_features_from_run.py "
                                                            "runs exactly this",
    "flashdraft run-local --preset tiny --set run_id=lr3e-3": "the run reading the features of the one above",
    "flashdraft sweep --preset smollm2-local": "a base run and three variant runs of the real 135M model (run by "
                                               "hand; tests/integration/test_sweep.py runs a sweep on tiny)",
    "flashdraft run-local --preset smollm2-local --set run_id=sep-": "the real 135M chat model end to end, the "
                                                                      "separate runs the sweep is measured against",
    "flashdraft status --run file://$PWD/runs/sw": "the SmolLM2 sweep above first",
}


def _not_here(command: str) -> str | None:
    return next((k for k in NOT_HERE if command.startswith(k)), None)


def runnable() -> list[DocCommand]:
    return [c for c in doc_commands() if _not_here(c.command) is None]


def test_every_documented_command_is_run_here_or_listed_with_a_reason():
    commands = [c.command for c in doc_commands()]
    assert commands, "no ```bash blocks found in README.md or docs/"
    stale = [k for k in NOT_HERE if not any(c.startswith(k) for c in commands)]
    assert not stale, f"NOT_HERE entries no longer in README.md or docs/: {stale}"
    # what the issue that made this tier asked for at least: the chart, compile and dry-run submit, and each
    # inspection command, are run here, not listed away
    run_here = " | ".join(c.command for c in runnable())
    for needed in ("make chart-pipeline", "make helm-lint", "make compile", "make submit-pipeline ARGS=--dry-run",
                   "flashdraft plan", "flashdraft show-config", "flashdraft config-reference", "flashdraft status",
                   "flashdraft report", "flashdraft export", "flashdraft features verify"):
        assert needed in run_here, f"`{needed}` is documented nowhere or not run by this tier"


def _check(ran: Ran) -> str:
    assert ran.returncode == 0 and "Traceback" not in ran.output, (
        f"`{ran.command}` failed as shown in the docs (exit {ran.returncode}):\n{ran.output[-3000:]}")
    return ran.output


RUNS_DOC = "docs/local-run.md"  # its commands start the local runs, then inspect them: run in their order


def test_documented_commands_work_as_written(user_repo):
    """Every runnable command outside docs/local-run.md (the planner, the chart, compile, a dry-run submit, ...),
    by bash in a clean copy of the repository, in the docs' order."""
    commands = [c for c in runnable() if c.doc != RUNS_DOC]
    assert not [c for c in commands if "run-local" in c.command], f"a run-local outside {RUNS_DOC}: put it there"
    for doc_command in commands:
        out = _check(run_as_user(doc_command.command, user_repo))
        if "--json" in doc_command.command and " plan " in doc_command.command:
            assert '"bytes_per_token": 51200' in out, "the README's comment says bytes_per_token = 51200"
        if doc_command.command.startswith("make chart-pipeline"):
            # the chart now renders: its compiled pipeline is in place, for the images the command named
            assert "registry.example.com/ml/flashdraft-trainer:v0.1.0" in (
                user_repo / "helm" / "flashdraft" / "files" / "pipeline.yaml").read_text()
        if doc_command.command.startswith("make compile"):
            assert (user_repo / "build" / "flashdraft-pipeline.yaml").is_file()
        if doc_command.command.startswith("make submit-pipeline ARGS=--dry-run"):
            assert "dry run: nothing was sent" in out
        if doc_command.command.startswith("flashdraft compile") and "--grid" in doc_command.command:
            assert "a sweep of 2 variants" in out  # docs/training.md's cluster sweep, submitted next
        if doc_command.command.startswith("flashdraft submit --package build/sweep.yaml"):
            assert '"display_name": "flashdraft-sweep"' in out and "dry run: nothing was sent" in out


@pytest.mark.slow
@pytest.mark.timeout(3600)  # two whole tiny runs: ~5 min on a quiet 2-core machine, far more under load
def test_local_runs_and_their_inspection_work_as_written_with_a_short_console(user_repo, tiny_streaming_run):
    """docs/local-run.md's runnable commands by bash in the user's copy, in their order: the tiny `run-local`, the
    streaming one (the session's tiny_streaming_run, run the same way; test_streaming_local.py checks it too), then
    the commands that inspect the tiny run (status, report, export, features verify, show-config, ...)."""
    commands = [c.command for c in runnable() if c.doc == RUNS_DOC]
    runs = [c for c in commands if "run-local" in c]
    assert [("streaming" in c) for c in runs] == [False, True], runs
    plain, streaming = runs
    assert commands.index(plain) == 0 and commands.index(streaming) == 1, "the runs come before what inspects them"
    assert streaming == tiny_streaming_run["command"]

    out = _check(run_as_user(plain, user_repo))
    lines = out.splitlines()
    assert len(lines) <= CONSOLE_MAX_LINES and len(out.encode()) <= CONSOLE_MAX_BYTES, out
    assert "executor_input" not in out and "KFP Executor" not in out
    for pattern in (r"plan +done .* bytes/token planned", r"prep +done .* prompts kept, \d+ quarantined",
                    r"generate shard 0 +done .* tokens/s", r"generate shard 1 +done .* tokens/s",
                    r"extract shard 0 +done .* bytes/token, [\d,]+ tokens/s", r"extract shard 1 +done",
                    r"train +done .* loss [\d.]+, slot-1 accuracy [\d.]+", r"evaluate +done .* tau [\d.]+ .*lossless "
                    r"passed", r"export +done"):
        assert re.search(pattern, out), f"no line matching {pattern!r} in:\n{out}"
    assert sum(" started" in line for line in lines) == 10  # plan, prep, 2+2 shards, train, eval, export, report
    table = [line for line in lines if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in table] == ["plan", "prep", "generate", "extract", "train",
                                                              "evaluate", "export"]
    assert all(row.split("│")[2].strip() == "done" for row in table)
    report = Path(next(line for line in lines if line.startswith("report: ")).removeprefix("report: "))
    assert report.is_file() and lines[-1].startswith("run-local succeeded")
    logs = Path(re.search(r"^logs: (\S+)", out, flags=re.M).group(1))
    logs = logs if logs.is_absolute() else user_repo / logs
    assert "executor_input" in (logs / "kfp-local.log").read_text(), "kfp's dumps went to the log folder"
    assert (logs / "train.log").is_file() and (logs / "extract-shard-00001.log").is_file()

    out, cfg = tiny_streaming_run["console"], tiny_streaming_run.cfg
    stream = open_store(cfg.storage, cfg.run_id).get_json_verified("metrics/stream.json")
    assert stream["produced_bytes"] > cfg.mode.window_bytes, "the example must produce more than its window"
    assert 0 < stream["peak_stored_bytes"] <= cfg.mode.window_bytes < stream["produced_bytes"]
    assert re.search(r"streaming: produced .* peak stored", out)

    inspected = set()
    for command in commands[2:]:
        out = _check(run_as_user(command, user_repo))
        verb = command.split()[1]
        inspected.add(verb)
        if verb == "status":
            assert all(f"│ {stage}" in out for stage in ("plan", "prep", "generate", "extract", "train", "evaluate",
                                                          "export")) and "failed" not in out
        if verb == "compare":  # the two runs side by side, and the one recipe key that differs between them
            assert re.search(r"runs/tiny +tiny-qwen3 +dflash .* passed", out), out
            assert re.search(r"mode\.kind +offline +streaming", out), out
            page = (user_repo / "compare-tiny.html").read_text()
            assert "held-out tau" in page and "data:image/png;base64," in page
    assert {"status", "compare", "report", "export", "features"} <= inspected, inspected
    # tracking.report_to's default: TensorBoard event files in the run's store, written with no server running
    for task in ("train", "evaluate"):
        assert list((user_repo / "runs" / "tiny" / "tensorboard" / task).glob("events.out.tfevents.*")), task
