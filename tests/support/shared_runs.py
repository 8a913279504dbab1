"""Runs several test modules read, made once per session (registered by tests/conftest.py's `pytest_plugins`).

Tests read a shared run and never change it: a test that must write (a rerun, an export, extra metrics) copies the
run's store folder first (`copy_run`). Each fixture is built on first use, so a module run alone pays only for the
runs it reads.

* `tiny_evaluated` (unit tier): plan, prep, a committed random drafter and evaluate on `tiny`: two suites (held-out
  with two user prompts from eval.extra_prompts, humaneval with thinking off), the shipped published figures.
  Read by test_evaluate, test_report and test_serving_doc.
* `smollm2_run` (integration tier): the real SmolLM2-135M-Instruct through every stage, small enough for CI.
  Read by test_generate_smollm2 and test_evaluate_smollm2.
* `user_repo` (integration tier): a clean copy of the repository sharing the installed venv, where documented
  commands run as subprocesses (tests/support/user_path.py). Read by test_readme_commands.
* `tiny_streaming_run` (integration tier): docs/local-run.md's streaming `run-local` command, as written, by bash in
  `user_repo`. Read by test_readme_commands and test_streaming_local.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flashdraft.config import RunConfig, load_config

from .evaluate_fixtures import commit_drafter
from .user_path import doc_commands, run_as_user, user_copy

ROOT = Path(__file__).resolve().parents[2]
# The session fixtures below that build a run; each is one xdist group, so its readers share one build under
# `make test`'s two workers (tests/conftest.py). tiny_streaming_run is built inside user_repo, so it is in that group.
SHARED_RUNS = ("user_repo", "smollm2_run", "tiny_evaluated")

# The console bound of `flashdraft run-local` (tested in test_local_run.py for a failed run, in
# test_readme_commands.py for the docs' tiny run): one line per task start and end, a 10-line summary table, 6 lines
# of paths and outcome.
CONSOLE_MAX_LINES = 60
CONSOLE_MAX_BYTES = 8000


@dataclass(frozen=True)
class SharedRun:
    """A finished run: its config, the `--set` pairs that made it (for CLI commands on the same run), its folder."""

    cfg: RunConfig
    sets: dict[str, str]
    folder: Path
    outputs: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.outputs[key]


def config_from_sets(preset: str, sets: dict[str, str]) -> RunConfig:
    return load_config(preset=preset, overrides=[f"{k}={v}" for k, v in sets.items()])


def copy_run(run: SharedRun, dest: Path, preset: str = "tiny") -> tuple[RunConfig, dict[str, str]]:
    """The shared run's store copied under `dest`; returns the config and `--set` pairs that address the copy."""
    shutil.copytree(run.folder / "runs", dest / "runs")
    sets = {**run.sets, "storage.root": f"file://{dest}/runs"}
    return config_from_sets(preset, sets), sets


@pytest.fixture(scope="session")
def tiny_evaluated(tmp_path_factory) -> SharedRun:
    """plan + prep + a committed drafter (seed 7) + evaluate on tiny, through the runner (which commits each stage's
    metrics). Held-out suite: 1 prompt of prep's eval split + 2 from eval.extra_prompts; humaneval: 1 prompt,
    thinking off; 8 new tokens; published figures from the shipped reference. No training: no train metrics.
    outputs: metrics (the EvaluateSummary), drafter_uri."""
    from flashdraft.components.plan.planner import run_plan
    from flashdraft.run.runner import run_task

    folder = tmp_path_factory.mktemp("tiny-evaluated")
    extra = folder / "extra.jsonl"
    extra.write_text(json.dumps({"id": "user-1", "prompt": "Say hello."}) + "\n\n"
                     + json.dumps({"messages": [{"role": "user", "content": "Count to five."}]}) + "\n")
    sets = {"storage.root": f"file://{folder}/runs", "eval.num_prompts": "1", "eval.max_new_tokens": "8",
            "eval.extra_prompts": str(extra), "eval.reference": "builtin:published",
            "eval.suites": "[heldout, {source: humaneval, num_prompts: 1, thinking: false}]"}
    cfg = config_from_sets("tiny", sets)
    run_plan(cfg)
    run_task(cfg, "prep")
    drafter_uri = commit_drafter(cfg, seed=7)
    return SharedRun(cfg, sets, folder, {"metrics": run_task(cfg, "evaluate"), "drafter_uri": drafter_uri})


@pytest.fixture(scope="session")
def smollm2_run(tmp_path_factory) -> SharedRun:
    """The real 135M chat model: prep, generate and extract on 2 shards, a short training, evaluate, through the
    runner, then the report. 32 train + 4 eval prompts, 64 response tokens. outputs: prep (prep's summary), generated
    (generate's summary per shard), metrics (evaluate's), report (run_report's)."""
    from flashdraft.components.report.report import run_report
    from flashdraft.run.runner import run_task

    folder = tmp_path_factory.mktemp("smollm2")
    cfg = load_config(preset="smollm2-local", overrides={
        # 32 train + 4 eval prompts (CI time: generation and training scale with them; 60 + 4 measured tau 1.106)
        "storage.root": f"file://{folder}/runs", "data.max_samples": 36, "data.num_shards": 2,
        "data.eval_count": 4, "data.max_response_tokens": 64, "eval.num_prompts": 4, "eval.max_new_tokens": 24,
        # ~35 small steps instead of a few large ones: the drafter learns enough in minutes to beat the baseline
        "training.tokens_per_step": 1024, "training.lr": 3e-3, "training.epochs": 8,
        # the preset's HumanEval suite and held-out curve have their own tests (test_eval_suites_s3,
        # test_train_heldout): here they would only add minutes
        "eval.suites": ["heldout"], "training.heldout_samples": 0})
    prep = run_task(cfg, "prep")
    generated = []
    for shard in range(prep.num_shards):
        generated.append(run_task(cfg, "generate", shard))
        run_task(cfg, "extract", shard)
    run_task(cfg, "train")
    metrics = run_task(cfg, "evaluate")
    return SharedRun(cfg, {}, folder, {"prep": prep, "generated": generated, "metrics": metrics,
                                       "report": run_report(cfg)})


def docs_streaming_command() -> str:
    """The streaming `run-local` command of docs/local-run.md, as written there."""
    (command,) = [c.command for c in doc_commands()
                  if c.doc == "docs/local-run.md" and "run-local" in c.command and "streaming" in c.command]
    return command


@pytest.fixture(scope="session")
def user_repo(tmp_path_factory) -> Path:
    """A clean copy of the repository sharing the installed venv and tools (tests/support/user_path.py), where the
    documented commands run as a user runs them; shared by the commands that need a run of their own first."""
    return user_copy(tmp_path_factory.mktemp("user-repo"))


@pytest.fixture(scope="session")
def tiny_streaming_run(user_repo) -> SharedRun:
    """docs/local-run.md's streaming `run-local` command, as written, by bash in the user's copy of the repository
    (the store, kfp's workdir and the exports land there). outputs: command, console (its output), result (the run's
    outcome as the store holds it: pipelines/local.py `outcome`, with the export folder the console names)."""
    from flashdraft.pipelines.local import outcome

    command = docs_streaming_command()
    ran = run_as_user(command, user_repo)
    assert ran.returncode == 0, f"`{command}` failed as shown in the docs:\n{ran.output[-3000:]}"
    sets = dict(a.split("=", 1) for a in shlex.split(command) if "=" in a)
    cfg = config_from_sets("tiny", sets)
    if cfg.storage.root.startswith("file://./"):  # the preset's relative store, made absolute for the readers
        cfg = cfg.with_overrides({"storage.root": f"file://{user_repo}/{cfg.storage.root.removeprefix('file://./')}"})
    exports = dict(re.findall(r"^drafter \((\w+), .*?\): (\S+)$", ran.output, flags=re.M))
    result = {"state": "SUCCEEDED", **outcome(cfg), "exports": exports}
    return SharedRun(cfg, sets, user_repo, {"command": command, "console": ran.output, "result": result})
