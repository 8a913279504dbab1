"""Every command README.md and docs/ show in a ```bash block works as shown, so the docs cannot rot silently.

The commands are read from README.md, then docs/*.md in name order. Each one is either run here (the `flashdraft`
commands, in that order, from a fresh folder, exactly as written) or listed in NOT_HERE with the reason it cannot
run in this suite (a cluster, a GPU, the network, or a long real-model run). A new command in the docs fails the
test until it is run or listed; a NOT_HERE entry whose command left the docs fails it too.

The tiny `run-local` of docs/local-run.md is also the console test: its output stays within the stated bound and
holds each stage's line with its headline figures and the final summary, and no kfp executor dump. Its streaming
example must really exercise the window: bytes produced above the window, peak stored within it and below produced.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from support.shared_runs import CONSOLE_MAX_BYTES, CONSOLE_MAX_LINES
from typer.testing import CliRunner

from flashdraft.cli import app
from flashdraft.store import open_store

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLASHDRAFT = (".venv/bin/flashdraft", "flashdraft")

# Command prefix -> why this suite does not run it.
NOT_HERE = {
    "make run-local": "the real 135M chat model end to end, 9.8 min on a quiet 2-core machine (run by hand; "
                      "the tiny run-local below takes the same path)",
    "make test": "the test suite itself",
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
    "make helm-install": "a Kubernetes cluster (the chart is installed into a real API server by tests/k8s)",
    "make compile": "`make install` first, which pip-installs whenever pyproject.toml changed; `flashdraft "
                    "compile` is tested in tests/unit/test_pipeline_compile.py",
    "export KFP_HOST=": "a shell assignment for the cluster commands below it",
    "export KFP_BEARER_TOKEN=": "kubectl against a cluster",
    "make submit-pipeline": "a KFP API server, after `make compile` (see above); the requests, --dry-run included, "
                            "are tested in tests/unit/test_submit_fake_kfp_api.py",
    "flashdraft extract --preset smollm2-local": "needs generate's responses for the run first (a pipeline step); "
                                                 "extraction is tested in tests/unit/test_extract.py",
    "flashdraft features verify": "needs that extraction first",
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
}


def readme_commands() -> list[str]:
    """The commands of every ```bash block, continuation lines joined, comments dropped."""
    blocks = [b for doc in DOCS for b in re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S)]
    out = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            command = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())  # README comments follow whitespace
            if command:
                out.append(command)
    return out


def _not_here(command: str) -> str | None:
    return next((k for k in NOT_HERE if command.startswith(k)), None)


def _flashdraft_args(command: str) -> list[str] | None:
    tokens = shlex.split(command)
    return tokens[1:] if tokens[0] in FLASHDRAFT else None


def test_every_readme_command_is_run_here_or_listed_with_a_reason():
    commands = readme_commands()
    assert commands, "no ```bash blocks found in README.md or docs/"
    unknown = [c for c in commands if _not_here(c) is None and _flashdraft_args(c) is None]
    assert not unknown, f"README/docs commands neither run by this test nor listed in NOT_HERE: {unknown}"
    stale = [k for k in NOT_HERE if not any(c.startswith(k) for c in commands)]
    assert not stale, f"NOT_HERE entries no longer in README.md or docs/: {stale}"


def _run(command: str) -> str:
    result = CliRunner().invoke(app, _flashdraft_args(command))
    assert result.exit_code == 0, f"`{command}` failed as shown in the docs:\n{result.output[-3000:]}"
    return result.output


def test_readme_quick_commands_work_as_shown(tmp_path, monkeypatch):
    """Everything runnable that does not start a pipeline run (the planner's reality check, ...)."""
    monkeypatch.chdir(tmp_path)
    quick = [c for c in readme_commands() if _not_here(c) is None and "run-local" not in c and " status " not in
             f"{c} "]
    assert any(" plan " in f"{c} " for c in quick)
    for command in quick:
        output = _run(command)
        if "--json" in command and " plan " in command:
            assert '"bytes_per_token": 51200' in output, "the README's comment says bytes_per_token = 51200"


@pytest.mark.slow
@pytest.mark.timeout(3600)  # two whole tiny runs: ~5 min on a quiet 2-core machine, far more under load
def test_readme_local_runs_work_as_shown_with_a_short_console(tmp_path, monkeypatch, tiny_streaming_run):
    """The docs' tiny and streaming `run-local` commands and `status`, in a fresh folder, in their order. The
    streaming command is the session's tiny_streaming_run (tests/support/shared_runs.py: run through the CLI as
    written, from a fresh folder of its own), which test_streaming_local.py checks too."""
    monkeypatch.chdir(tmp_path)
    runs = [c for c in readme_commands() if _not_here(c) is None and ("run-local" in c or " status " in f"{c} ")]
    assert [("streaming" in c, "status" in c) for c in runs] == [(False, False), (True, False), (False, True)], runs
    plain, streaming, status = runs

    out = _run(plain)
    lines = out.splitlines()
    assert len(lines) <= CONSOLE_MAX_LINES and len(out.encode()) <= CONSOLE_MAX_BYTES, out
    assert "executor_input" not in out and "KFP Executor" not in out and "Traceback" not in out
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
    assert "executor_input" in (logs / "kfp-local.log").read_text(), "kfp's dumps went to the log folder"
    assert (logs / "train.log").is_file() and (logs / "extract-shard-00001.log").is_file()

    assert streaming == tiny_streaming_run["command"]
    out, cfg = tiny_streaming_run["console"], tiny_streaming_run.cfg
    stream = open_store(cfg.storage, cfg.run_id).get_json_verified("metrics/stream.json")
    assert stream["produced_bytes"] > cfg.mode.window_bytes, "the example must produce more than its window"
    assert 0 < stream["peak_stored_bytes"] <= cfg.mode.window_bytes < stream["produced_bytes"]
    assert re.search(r"streaming: produced .* peak stored", out)

    out = _run(status)
    assert all(f"│ {stage}" in out for stage in ("plan", "prep", "generate", "extract", "train", "evaluate",
                                                  "export")) and "failed" not in out
