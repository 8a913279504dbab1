"""Every `flashdraft` command answers --help, and config errors exit cleanly with the field named."""

import re
import subprocess
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from flashdraft.cli.main import app


def _command_paths(cmd, prefix=()):
    yield prefix
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _command_paths(sub, (*prefix, name))


def test_help_on_every_command():
    runner = CliRunner()
    paths = list(_command_paths(get_command(app)))
    assert ("plan",) in paths and len(paths) > 3
    for path in paths:
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0, f"flashdraft {' '.join(path)} --help failed: {res.output}"
        assert "Usage" in res.output


def test_show_config_prints_derived_values_and_rejects_bad_fields():
    runner = CliRunner()
    res = runner.invoke(app, ["show-config", "--preset", "smollm2-local"])
    assert res.exit_code == 0 and "layer_ids = [1, 8, 14, 20, 27]" in res.output
    res = runner.invoke(app, ["show-config", "--preset", "tiny", "--set", "drafter.block_size=1"])
    assert res.exit_code == 1 and "drafter.block_size" in res.output


def test_config_reference_command_prints_one_section_and_writes_the_doc(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["config-reference", "training"])
    assert res.exit_code == 0 and "`training.num_threads`" in res.output and "## storage" not in res.output
    res = runner.invoke(app, ["config-reference", "--output", str(tmp_path / "ref.md")])
    assert res.exit_code == 0 and "## export" in (tmp_path / "ref.md").read_text()
    res = runner.invoke(app, ["config-reference", "nope"])
    assert res.exit_code == 2 and "no config section 'nope'" in res.output
    res = runner.invoke(app, ["config-reference", "trainig"])  # a command-line argument: usage error, exit 2
    assert res.exit_code == 2 and "no config section 'trainig' (did you mean training?)" in res.output


def test_export_cli_flags_override_the_config_before_any_work():
    res = CliRunner().invoke(app, ["export", "--preset", "tiny", "--dtype", "float64"])
    assert res.exit_code == 1 and "export.dtype" in res.output


def test_version_and_short_help(monkeypatch):
    """--version names the version and the commit (an image's FLASHDRAFT_COMMIT, else this checkout's HEAD);
    -h is --help on every command."""
    import flashdraft

    monkeypatch.setenv("FLASHDRAFT_COMMIT", "0123abc")
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output == f"flashdraft {flashdraft.__version__} (commit 0123abc)\n"
    monkeypatch.delenv("FLASHDRAFT_COMMIT")
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(flashdraft.__file__).parent).stdout.strip()
    commit = rf"{head}(\+dirty)?" if head else "unknown"  # a copy without git history: said so
    assert re.fullmatch(rf"flashdraft \S+ \(commit {commit}\)\n", CliRunner().invoke(app, ["--version"]).output)
    runner = CliRunner()
    for path in _command_paths(get_command(app)):
        res = runner.invoke(app, [*path, "-h"])
        assert res.exit_code == 0 and "Usage" in res.output, f"flashdraft {' '.join(path)} -h: {res.output}"


def test_help_lists_every_packaged_preset():
    from flashdraft.config import preset_names

    text = " ".join(CliRunner().invoke(app, ["plan", "--help"], terminal_width=400).output.split())
    assert "qwen3.6-27b-rehearsal" in preset_names()
    for name in preset_names():
        assert name in text, f"{name} missing from --preset's help"


@pytest.mark.parametrize("args, line", [
    (["--set", "training.max_step=10"], "training.max_step: Extra inputs are not permitted (did you mean "
                                        "training.max_steps?)"),
    (["--set", "trainig.lr=1e-4"], "trainig: Extra inputs are not permitted (did you mean training?)"),
    (["--preset", "tyni"], "unknown preset 'tyni' (did you mean tiny?); available: gpt-oss-20b"),
    (["--set", "pools.trainer.gpu_type=h10"], "unknown GPU 'h10' (did you mean h100?); known: a100"),
])
def test_mistyped_names_get_a_suggestion_and_exit_1(args, line):
    """Every config error, the planner's unknown GPU included, is one line with the nearest name and exit 1."""
    preset = [] if "--preset" in args else ["--preset", "tiny"]
    res = CliRunner().invoke(app, ["plan", *preset, *args], terminal_width=400)
    assert res.exit_code == 1, res.output
    assert line in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not res.output.startswith(("'", '"')), "no stray quotes (str of a KeyError)"


def test_per_shard_commands_require_shard():
    """generate and extract take --shard the same way: required, so nobody runs one shard of several unawares."""
    for stage in ("generate", "extract"):
        res = CliRunner().invoke(app, [stage, "--preset", "tiny"])
        assert res.exit_code == 2 and "Missing option '--shard'" in res.output, res.output


def test_cpu_plan_table_has_no_none():
    res = CliRunner().invoke(app, ["plan", "--preset", "tiny"], terminal_width=200)
    assert res.exit_code == 0 and "None" not in res.output
    assert "inference GPUs per trainer GPU (streaming, to keep up): - (no GPU rate" in res.output


def test_compile_names_its_images_and_their_origin(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHDRAFT_IMAGE_REGISTRY", raising=False)
    monkeypatch.setenv("FLASHDRAFT_IMAGE_TAG", "v9")
    res = CliRunner().invoke(app, ["compile", "--preset", "tiny", "-o", str(tmp_path / "p.yaml")],
                             terminal_width=400)
    assert res.exit_code == 0, res.output
    assert res.output.count("\n") == 1
    assert ("images ghcr.io/flashdraft/flashdraft-base:v9, ghcr.io/flashdraft/flashdraft-inference:v9, "
            "ghcr.io/flashdraft/flashdraft-trainer:v9 (registry: the default, tag: FLASHDRAFT_IMAGE_TAG; pass "
            "--registry/--tag") in res.output


def test_root_help_starts_with_what_a_user_runs_first():
    """`flashdraft --help` opens on what the tool does and the start-here commands (run-local, plan, status), listed
    before the pipeline stages and the cluster plumbing."""
    out = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    assert out.index("Start with `flashdraft run-local`") < out.index("Commands")
    names = [m.group(1) for m in re.finditer(r"^│ ([a-z][a-z-]+) ", out, flags=re.M)]
    assert names[:3] == ["run-local", "plan", "status"], names
    assert names.index("status") < names.index("prep") < names.index("compile") < names.index("presets")
    assert "registry.py" not in out.split("Commands")[0]  # no implementation notes before the commands
