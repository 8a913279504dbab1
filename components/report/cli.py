"""`flashdraft report`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flashdraft.cli_options import ConfigOpt, PresetOpt, SetOpt, run_config


def report(
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    set_: SetOpt = None,
    run: Annotated[str | None, typer.Option("--run", help="Run store URI (e.g. file:///data/runs/tiny or "
                                                          "s3://bucket/runs/x); regenerates from stored metrics.")]
    = None,
    endpoint_url: Annotated[str | None, typer.Option("--endpoint-url", help="S3 endpoint for --run.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Also write report.html/summary.md/metrics.json here.")]
    = None,
) -> None:
    """Render the run report (HTML with charts, Markdown summary, scalar metrics) into reports/ of the run."""
    from flashdraft.components.report.report import build_report, run_report

    from flashdraft.config import StorageConfig
    from flashdraft.store import ObjectStore

    if run:
        result = build_report(ObjectStore(run, StorageConfig(root=run, endpoint_url=endpoint_url)), out_dir=out)
    elif config or preset:
        result = run_report(run_config(config, preset, set_), out_dir=out)
    else:
        typer.secho("pass --run RUN_URI, or --preset/--config for the run to report on", fg=typer.colors.RED,
                    err=True)
        raise typer.Exit(2)
    typer.echo(json.dumps(result.dump(), indent=2))


def register(app: typer.Typer) -> None:
    app.command("report")(report)
