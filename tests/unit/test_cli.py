"""Every `flashdraft` command answers --help, and config errors exit cleanly with the field named."""

from typer.main import get_command
from typer.testing import CliRunner

from flashdraft.cli import app


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


def test_export_cli_flags_override_the_config_before_any_work():
    res = CliRunner().invoke(app, ["export", "--preset", "tiny", "--dtype", "float64"])
    assert res.exit_code == 1 and "export.dtype" in res.output
