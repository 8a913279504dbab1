"""The `flashdraft` command: one sub-command per stage, each defined next to its stage in components/."""

from __future__ import annotations

import importlib
import time
from typing import Annotated

import typer

from flashdraft.cli_options import ConfigOpt, EndpointOpt, PresetOpt, RunOpt, SetOpt, run_config, run_store

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

# (command name, module defining `register(app)`). Each stage module adds its own command(s); importing them is
# cheap because heavy imports (torch, transformers, vllm) happen inside the command bodies.
_COMMAND_MODULES = [
    "flashdraft.components.plan.cli",
    "flashdraft.components.prep.cli",
    "flashdraft.components.generate.cli",
    "flashdraft.components.extract.cli",
    "flashdraft.components.train.cli",
    "flashdraft.components.export.cli",
    "flashdraft.components.evaluate.cli",
    "flashdraft.components.report.cli",
    "flashdraft.pipelines.cli",
]

for _module in _COMMAND_MODULES:
    importlib.import_module(_module).register(app)


@app.command("presets")
def presets() -> None:
    """List the packaged presets."""
    from flashdraft.config import preset_names

    for name in preset_names():
        typer.echo(name)


@app.command("show-config")
def show_config(config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
    """Print the fully resolved run config (presets, file and overrides applied; derived values shown)."""
    from flashdraft.config import dump_config

    cfg = run_config(config, preset, set_)
    typer.echo(dump_config(cfg))
    if cfg.target.num_layers:
        typer.echo(f"# derived: features.layer_ids = {cfg.layer_ids()}  drafter.gamma = {cfg.drafter.resolved_gamma}")

@app.command("status")
def status(
    run: RunOpt = None, endpoint_url: EndpointOpt = None,
    config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable: one object per stage.")] = False,
) -> None:
    """Stage-by-stage state of a run from its committed records: done (with figures), running, failed (with the
    error, shard and log location) or not run. Works for any run in any store, wherever it was started."""
    import json
    import sys

    from rich.console import Console

    from flashdraft.pipelines.console import summary_table
    from flashdraft.status import describe, metrics_names, read_records, stage_statuses
    from flashdraft.store import open_store

    if run:
        store = run_store(run, endpoint_url)
    elif config or preset:
        cfg = run_config(config, preset, set_)
        store = open_store(cfg.storage, cfg.run_id)
    else:
        typer.secho("pass --run RUN_URI, or --preset/--config for the run", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    statuses = stage_statuses(read_records(store), metrics_names(store))
    if as_json:
        typer.echo(json.dumps([{**s.model_dump(mode="json", exclude={"tasks"}), "detail": describe(s),
                                "tasks": [t.model_dump(mode="json") for t in s.tasks]} for s in statuses], indent=2))
        return
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 120)
    console.print(f"run {store.root}", highlight=False, markup=False, soft_wrap=True)
    console.print(summary_table(statuses))
    for s in statuses:  # the detail a table cell cannot hold: errors and where to read more
        for t in s.tasks:
            if t.state == "failed":
                console.print(f"{t.label} failed: {t.failure()}\n  log: {t.log or 'not recorded'}", style="red",
                              highlight=False, markup=False, soft_wrap=True)
            elif t.state == "running":
                console.print(f"{t.label} running since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t.started))}"
                              f" (attempt {t.attempt}; log: {t.log or 'not recorded'})", highlight=False,
                              markup=False, soft_wrap=True)


if __name__ == "__main__":
    app()
