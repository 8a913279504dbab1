"""`flashdraft prep` prints the summary table, and a user's mistake exits 1 with the reason, no traceback."""

from typer.testing import CliRunner

from flashdraft.cli.main import app


def test_prep_cli_prints_the_table_and_reports_bad_sources(tmp_path):
    runner = CliRunner()
    base = ["prep", "--preset", "tiny", "--set", f"storage.root=file://{tmp_path}/runs"]
    ok = runner.invoke(app, base)
    assert ok.exit_code == 0, ok.output
    assert "| train / eval | 36 / 4 |" in ok.output
    bad = runner.invoke(app, ["prep", "--preset", "tiny", "--set", f"storage.root=file://{tmp_path}/other",
                              "--set", f"data.sources=[{{uri: {tmp_path}/missing.jsonl}}]"])
    assert bad.exit_code == 1
    assert "missing.jsonl: file not found" in bad.output and "Traceback" not in bad.output
