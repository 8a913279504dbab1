"""`run-local --runner docker` before any container runs: the version rule and the one-line refusals that need no
Docker engine (the tier that builds and runs the images is tests/containers)."""

from __future__ import annotations

from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.pipelines.containers import ContainerRun, versions_match
from flashdraft.pipelines.pipeline import POOL_IMAGE


def test_versions_match_on_version_and_on_commit_where_both_know_it():
    host = "flashdraft 0.1.0 (commit 1111aaaa)"
    assert versions_match(host, "flashdraft 0.1.0 (commit 1111aaaa)")
    assert versions_match("flashdraft 0.1.0 (commit 1111aaaa+dirty)", "flashdraft 0.1.0 (commit 1111aaaa)")
    assert versions_match(host, "flashdraft 0.1.0 (commit unknown)")  # an image built without FLASHDRAFT_COMMIT
    assert not versions_match(host, "flashdraft 0.1.0 (commit 2222bbbb)")
    assert not versions_match(host, "flashdraft 0.0.9 (commit 1111aaaa)")
    assert not versions_match(host, "")


def test_one_image_for_every_pool_or_each_pools_image_from_registry_and_tag():
    assert ContainerRun.resolve("me/flashdraft-base:dev").images == {p: "me/flashdraft-base:dev" for p in POOL_IMAGE}
    per_pool = ContainerRun.resolve(registry="reg.example/ml", tag="v1").images
    assert per_pool == {pool: f"reg.example/ml/{name}:v1" for pool, name in POOL_IMAGE.items()}


def test_no_docker_daemon_is_one_line_and_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    result = CliRunner().invoke(app, ["run-local", "--preset", "tiny", "--runner", "docker", "--image", "x:y",
                                      "--workdir", str(tmp_path / "kfp"), "--set",
                                      f"storage.root=file://{tmp_path}/runs"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith(f"no Docker daemon at unix://{tmp_path}/no-such.sock"), result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))


def test_an_unknown_runner_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["run-local", "--preset", "tiny", "--runner", "podman",
                                      "--workdir", str(tmp_path / "kfp")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == "--runner must be subprocess or docker, got 'podman'"


def test_the_containers_get_the_hub_token_and_mirror_from_this_environment_not_the_command(tmp_path, monkeypatch):
    """As the S3 keys: HF_TOKEN and HF_ENDPOINT travel as the containers' environment (a Hub mirror, a gated
    source), never as an argument the task's command line or kfp's log would show."""
    from flashdraft.config import load_config

    monkeypatch.setenv("HF_TOKEN", "hf_sentinelRunnerToken")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:8090")
    runner = ContainerRun.resolve("me/flashdraft-base:dev").kfp_runner(load_config(preset="tiny"), tmp_path,
                                                                       {"FLASHDRAFT_X": "1"})
    env = runner.container_run_args["environment"]
    assert env["HF_TOKEN"] == "hf_sentinelRunnerToken" and env["HF_ENDPOINT"] == "http://127.0.0.1:8090"
    assert "hf_sentinelRunnerToken" not in repr({k: v for k, v in runner.container_run_args.items()
                                                  if k != "environment"})
