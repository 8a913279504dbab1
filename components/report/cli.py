"""`flashdraft report`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flashdraft.cli.options import (
    ConfigOpt,
    EndpointOpt,
    PresetOpt,
    RunOpt,
    SetOpt,
    check_store,
    fail,
    run_config,
    run_store,
)


def report(
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    endpoint_url: EndpointOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="Also write report.html/summary.md/metrics.json here.")]
    = None,
) -> None:
    """Render the run report (HTML with charts, Markdown summary, scalar metrics) into reports/ of the run; with
    --run, regenerated from that run's stored metrics."""
    from flashdraft.components.report.report import build_report, run_report

    if run:
        from flashdraft.run.status import is_run, no_run_message

        store = run_store(run, endpoint_url)
        if not is_run(store):  # a store root or a typo: never commit a report of nothing there
            raise fail(no_run_message(store, command="report"), 1)
        result = build_report(store, out_dir=out)
    elif config or preset:
        cfg = run_config(config, preset, set_)
        check_store(cfg)  # it commits reports/: the write preflight, one line in seconds for a bad store
        result = run_report(cfg, out_dir=out)
    else:
        typer.secho("pass --run RUN_URI, or --preset/--config for the run to report on", fg=typer.colors.RED,
                    err=True)
        raise typer.Exit(2)
    typer.echo(json.dumps(result.dump(), indent=2))

