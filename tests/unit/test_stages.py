"""A stage is declared once: a toy stage declared here, and nowhere else, added to a registry built from the
built-in one, gets a `flashdraft` command that runs it through the runner, a task in the compiled pipeline (after
its upstream, on its pool, with its timeout) and a row in `flashdraft status`; the built-in registry is untouched."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from flashdraft.cli.main import build_app
from flashdraft.config import load_config
from flashdraft.pipelines.pipeline import compile_pipeline, stage_images
from flashdraft.run import registry
from flashdraft.run.contract import Stage
from flashdraft.run.registry import StageRegistry
from flashdraft.run.stage import StageSummary, numbers

TOY_TIMEOUT_S = 1234


class ToySummary(StageSummary):
    checked: int = 0

    def figures(self) -> dict[str, float]:
        return numbers({"checked": self.checked})


class Toy(Stage):
    name = "toy"
    summary = ToySummary
    pool = "cpu"
    timeout_s = TOY_TIMEOUT_S
    doc = "A toy stage declared by a test."
    upstream = ("train",)
    reads = ("eval",)

    def run(self, cfg, shard=None) -> ToySummary:
        """The toy stage's logic: count the run's eval prompts setting."""
        return ToySummary(checked=cfg.eval.num_prompts)


class Bad(Stage):
    name = "bad"
    pool = "cpu"
    timeout_s = 60


class BadUpstream(Bad):
    upstream = ("nope",)


class BadExitHandler(Bad):
    exit_handler = True


TOY = Toy()


@pytest.fixture()
def toy():
    with registry.active(registry.builtin().with_stage(TOY)) as with_toy:
        yield with_toy
    assert "toy" not in registry.current().names() and "toy" not in registry.builtin().names()


def test_a_toy_stage_appears_in_the_cli_the_pipeline_and_status(toy, tmp_path):
    names = toy.names()
    assert names.index("toy") == names.index("export") + 1, "after the last stage, before report"
    app, runner = build_app(), CliRunner()
    assert "A toy stage declared by a test." in runner.invoke(app, ["--help"]).output
    args = ["--preset", "tiny", "--set", f"storage.root=file://{tmp_path}/store"]
    out = runner.invoke(app, ["toy", *args])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output.splitlines()[-1])["checked"] == 4
    again = runner.invoke(app, ["toy", *args])
    assert json.loads(again.output.splitlines()[-1])["skipped"] is True, "the runner reuses its result"

    status = runner.invoke(app, ["status", *args, "--json"])
    row = next(s for s in json.loads(status.output) if s["stage"] == "toy")
    assert row["detail"] == "reused: fingerprint matches" and row["figures"] == {"checked": 4.0}

    path = tmp_path / "p.yaml"
    compile_pipeline(load_config(preset="tiny"), str(path))
    spec, platform = yaml.safe_load_all(path.read_text())
    tasks = {}
    for comp in [spec["root"], *spec["components"].values()]:
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    task = next(t for t in tasks.values() if t["inputs"]["parameters"].get("stage", {}).get(
        "runtimeValue", {}).get("constant") == "toy")
    assert "train" in task["dependentTasks"]
    executor = spec["deploymentSpec"]["executors"][task["componentRef"]["name"].replace("comp-", "exec-")]
    assert executor["container"]["image"] == stage_images()["cpu"], "the cpu pool's image (make exports the tag)"
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert k8s[task["componentRef"]["name"].replace("comp-", "exec-")]["activeDeadlineSeconds"] == str(TOY_TIMEOUT_S)


def test_a_registry_refuses_an_undeclared_upstream_stage_a_duplicate_a_second_exit_handler_and_no_name():
    with pytest.raises(ValueError, match="upstream stage 'nope' is not declared before it"):
        registry.builtin().with_stage(BadUpstream())
    with pytest.raises(ValueError, match="stage 'plan' is declared twice"):
        StageRegistry((*registry.builtin().stages, registry.builtin().get("plan")))
    with pytest.raises(ValueError, match=r"stages \['report', 'bad'\] are all declared exit_handler"):
        registry.builtin().with_stage(BadExitHandler(), after="report")
    with pytest.raises(ValueError, match="stage class Stage declares no name, pool, timeout_s"):
        registry.builtin().with_stage(Stage())
    assert "bad" not in registry.current().names()


def test_the_builtin_registry_is_built_from_each_stage_package():
    """Every built-in stage is one object declared in its own package's stage.py, its summary type beside it, and
    the registry the core receives (the `flashdraft.stages` entry point) is components/stages.py's."""
    from flashdraft.components.stages import BUILTIN

    assert registry.builtin() is BUILTIN
    for stage in registry.builtin():
        package = stage.name.replace("-", "_")
        assert type(stage).__module__ == f"flashdraft.components.{package}.stage", stage.name
        assert stage.summary.__module__ == f"flashdraft.components.{package}.summary", stage.name


def test_each_stage_declares_the_outputs_the_store_names_it_for():
    """The store's advice for corrupt bytes (storage/layout.py STAGE_OUTPUTS) and `--from` (each stage's
    `outputs`) read one table: every stage's outputs are its entry there, and every entry is a stage's."""
    from flashdraft.storage.layout import STAGE_OUTPUTS

    declared = {stage.name: stage.outputs for stage in registry.builtin() if stage.outputs}
    assert declared == STAGE_OUTPUTS


class RecordingMetrics:
    """A KFP Metrics artifact's one method, recording each call (the real one keeps only the last value)."""

    def __init__(self) -> None:
        self.logged: list[str] = []

    def log_metric(self, key: str, value: float) -> None:
        self.logged.append(key)


def test_the_generic_kfp_body_runs_the_stage_object_and_logs_each_metric_once(toy, tmp_path):
    """The generic component body (pipelines/stages.py `stage_task`, called as kfp.local calls it) runs the toy
    stage's own `run` through the runner; the task's KFP metrics (the summary's numbers, the figures, the duration)
    are logged once each."""
    from flashdraft.config import dump_config
    from flashdraft.pipelines.stages import stage_task

    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store"})
    metrics = RecordingMetrics()
    out = json.loads(stage_task(dump_config(cfg), {}, "toy", metrics, -1))
    assert out["checked"] == 4
    assert sorted(metrics.logged) == ["checked", "duration_s"]
    reused = RecordingMetrics()
    assert json.loads(stage_task(dump_config(cfg), {}, "toy", reused, -1))["skipped"] is True
    assert sorted(reused.logged) == ["checked", "duration_s"]
