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



def compare(
    runs: Annotated[list[str], typer.Argument(help="Run URIs, as `flashdraft status --run` takes them "
                                                   "(file://./runs/tiny, s3://bucket/prefix/run_id).")],
    endpoint_url: EndpointOpt = None,
    html: Annotated[Path | None, typer.Option("--html", help="Also write an HTML page with the loss and held-out "
                                              "tau curves of every run on shared axes.")] = None,
) -> None:
    """Runs side by side: target, drafter and parent, samples, steps, final loss, held-out and per-suite tau,
    speedup, lossless verdict, training GPU-hours and plan cost, then the config keys that differ
    (docs/tracking.md)."""
    from flashdraft.components.report.compare import compare as compare_runs
    from flashdraft.components.report.compare import render_html, render_text
    from flashdraft.run.status import is_run, no_run_message

    if len(runs) < 2:
        raise fail("compare needs two runs or more", 2)
    stores = [run_store(run, endpoint_url) for run in runs]
    for store in stores:
        if not is_run(store):
            raise fail(no_run_message(store, command="compare"), 1)
    comparison = compare_runs(stores)
    typer.echo(render_text(comparison), nl=False)
    if html is not None:
        html.write_text(render_html(comparison))
        typer.echo(f"wrote {html}")
