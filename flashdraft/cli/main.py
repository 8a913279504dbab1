"""The `flashdraft` command: one sub-command per registered stage (flashdraft/run/registry.py), plus the pipeline and
inspection commands. Its help lists what a user runs first (HELP_START) before the stages and the cluster plumbing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

import typer

from flashdraft import __version__
from flashdraft.cli.config_reference import render
from flashdraft.cli.options import (
    ConfigOpt,
    EndpointOpt,
    PresetOpt,
    RunOpt,
    SetOpt,
    ShardOpt,
    check_readable_store,
    fail,
    run_config,
    run_stage,
    run_store,
)
from flashdraft.config import ConfigError, StorageConfig, dump_config, preset_names
from flashdraft.run import registry
from flashdraft.run.contract import Stage
from flashdraft.run.provenance import git_commit
from flashdraft.storage import layout

# Commands that are not a stage's: the pipeline commands (compile, submit, run-local), received from the top layer
# through this entry point group (pyproject.toml) as `register(app)` functions; importing them is cheap (heavy
# imports sit in the bodies).
COMMAND_ENTRY_POINTS = "flashdraft.commands"


def stage_command(stage: Stage) -> Callable[..., None]:
    """The generic `flashdraft <stage>` command of a stage that declares no CLI of its own: run the stage (one
    shard for a per-shard stage) through the runner and print its summary as JSON."""

    def run(shard: int | None, config: Any, preset: Any, set_: Any) -> None:
        summary = run_stage(run_config(config, preset, set_), stage.name, shard)
        typer.echo(json.dumps(summary.handoff(), sort_keys=True, default=str))

    if stage.per_shard:
        def command(shard: ShardOpt, config: ConfigOpt = None, preset: PresetOpt = None,
                    set_: SetOpt = None) -> None:
            run(shard, config, preset, set_)
    else:
        def command(config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
            run(None, config, preset, set_)
    command.__doc__ = stage.doc
    return command


# The root help: what the tool is and where a user starts, not how it is built (that is this module's docstring).
ROOT_HELP = ("Train DFlash speculative-decoding drafters for a target LLM, on one machine or a Kubernetes GPU "
             "cluster.\n\n"
             "Start with `flashdraft run-local` (the whole pipeline on this machine with a small real model), "
             "`flashdraft plan --preset qwen3.6-27b` (storage, GPU-hours and cost before any GPU) and "
             "`flashdraft status --run RUN_URI` (where a run stands, what failed and where its log is). "
             "Docs: README.md and docs/.")

# Help panels, in the order `flashdraft --help` shows them: the start-here commands first, under "Commands", then
# each panel's. typer prints panels in the order their first command is listed, so the commands are sorted too.
HELP_START = ("run-local", "plan", "status", "compare", "report")
HELP_PANELS = {
    "Pipeline stages (one task each; run-local and the cluster run them for you)":
        ("prep", "generate", "extract", "train", "evaluate", "export"),
    "Cluster": ("compile", "submit", "sweep", "upload-pipeline", "chart-config"),
    "Inspect": ("presets", "show-config", "config-reference", "features"),
}


def _command_name(info: Any) -> str:
    """A registered command's or group's name as the help shows it."""
    return info.name or (info.callback.__name__.replace("_", "-") if info.callback else "")


def _help_rank(name: str) -> tuple[int, int]:
    """Sort key of a command in the help: the start-here commands, then each panel's in its order, then the rest."""
    if name in HELP_START:
        return 0, HELP_START.index(name)
    for rank, names in enumerate(HELP_PANELS.values(), start=1):
        if name in names:
            return rank, names.index(name)
    return len(HELP_PANELS) + 1, 0


def _arrange_help(app: typer.Typer) -> None:
    """Put every registered command and group into its help panel, start-here commands first."""
    panel_of = {name: panel for panel, names in HELP_PANELS.items() for name in names}
    for info in [*app.registered_commands, *app.registered_groups]:
        if _command_name(info) in panel_of and not info.rich_help_panel:
            info.rich_help_panel = panel_of[_command_name(info)]
    app.registered_commands.sort(key=lambda info: _help_rank(_command_name(info)))


# -h as well as --help on every command (click hands a group's help_option_names down to its sub-commands).
CONTEXT = {"help_option_names": ["-h", "--help"]}


def version_line() -> str:
    """`flashdraft 0.1.0 (commit 6e030b9...)`: the version, and the git commit when it is known (an image's
    $FLASHDRAFT_COMMIT or the checkout flashdraft runs from; flashdraft/run/provenance.py)."""
    commit = git_commit()
    return f"flashdraft {__version__}" + (f" (commit {commit})" if commit else " (commit unknown)")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print the flashdraft version (and git commit) and exit.")]
          = False) -> None:
    pass


def build_app() -> typer.Typer:
    """The `flashdraft` command from the registered stages (flashdraft/run/registry.py: each stage object's
    command) and the `flashdraft.commands` entry points. Built when called, so a stage declared later (a plugin, a
    test's toy stage) gets its command too."""
    app = typer.Typer(help=ROOT_HELP, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                      context_settings=CONTEXT)  # sub-commands and `features` inherit -h
    app.callback()(_root)
    for stage in registry.current():
        if stage.has_command:
            app.command(stage.name, help=stage.doc or None)(stage.command() or stage_command(stage))
    for stage in registry.current():  # after every stage's own command: `flashdraft features verify`
        stage.add_commands(app)
    for entry in entry_points(group=COMMAND_ENTRY_POINTS):
        entry.load()(app)
    app.command("presets")(presets)
    app.command("show-config")(show_config)
    app.command("config-reference")(config_reference)
    app.command("status")(status)
    _arrange_help(app)
    return app


def presets() -> None:
    """List the packaged presets."""
    for name in preset_names():
        typer.echo(name)


def show_config(config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
    """Print the fully resolved run config (presets, file and overrides applied; derived values shown)."""
    cfg = run_config(config, preset, set_)
    typer.echo(dump_config(cfg))
    if cfg.target.num_layers:
        typer.echo(f"# derived: features.layer_ids = {cfg.layer_ids()}  drafter.gamma = {cfg.drafter.resolved_gamma}")

def config_reference(
    section: Annotated[str | None, typer.Argument(help="Only this section, e.g. training.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the Markdown here instead of "
                                                                       "printing it.")] = None,
) -> None:
    """Every config field with its type, default and description (what --set can change). The committed
    docs/config-reference.md is this command's output."""
    try:
        text = render(section)
    except KeyError as exc:
        raise fail(exc.args[0], 2) from None
    if output is None:
        typer.echo(text)
    else:
        output.write_text(text + "\n")
        typer.echo(f"wrote {output}")


def status_details(store) -> list[str]:
    """What each stage's committed summary adds below the status table (`StageSummary.status_detail`: evaluate's
    per-suite table), in pipeline order."""
    out = []
    for stage in registry.current():
        key = layout.metrics_key(stage.name)
        if not stage.per_shard and store.is_committed(key):
            detail = stage.summary.model_validate(store.get_json_verified(key)).status_detail()
            out += [detail] if detail else []
    return out


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

    # here, not at import: these import the store (fsspec/s3fs), which would slow every --help
    from flashdraft.cli.console import summary_table
    from flashdraft.run.overview import stage_statuses
    from flashdraft.run.source import read_source, readers
    from flashdraft.run.status import (
        describe,
        find_runs,
        is_run,
        metrics_names,
        no_run_message,
        read_records,
    )
    from flashdraft.storage.lease import describe_writer
    from flashdraft.storage.store import ObjectStore, open_store

    root = None
    if run:
        store = run_store(run, endpoint_url)
    elif config or preset:
        cfg = run_config(config, preset, set_)
        check_readable_store(cfg)
        store, root = open_store(cfg.storage, cfg.run_id, read_only=True), open_store(cfg.storage, read_only=True)
    else:  # list the runs in the default store root, the one `run-local` writes to
        default = ObjectStore(StorageConfig().root, read_only=True)
        runs = find_runs(default)
        found = (f"; runs under {default.url()}: {', '.join(runs)}" if runs else
                 f"; no run under {default.url()} (the default storage.root)")
        raise fail(f"pass --run RUN_URI, or --preset/--config for the run{found}", 2)
    if not is_run(store):  # a store root or a mistyped path: say so instead of a table of "not run"
        raise fail(no_run_message(store, root), 1)
    statuses = stage_statuses(read_records(store), metrics_names(store))
    if as_json:
        typer.echo(json.dumps([{**s.model_dump(mode="json", exclude={"tasks"}), "detail": describe(s),
                                "tasks": [t.model_dump(mode="json") for t in s.tasks]} for s in statuses], indent=2))
        return
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 120)
    console.print(f"run {store.root}", highlight=False, markup=False, soft_wrap=True)
    console.print(summary_table(statuses))
    if (source := read_source(store)) is not None:
        console.print(f"features from run {source.source} (data.features_from: its prep, generate and extract)",
                      highlight=False, markup=False, soft_wrap=True)
    if found := readers(store):  # its owner sees who reads its features before recomputing them (--from)
        console.print("read by: " + ", ".join(f"{r.run_id} ({r.reader})" for r in found), highlight=False,
                      markup=False, soft_wrap=True)
    for detail in status_details(store):
        console.print(detail, highlight=False, markup=False, soft_wrap=True)
    for s in statuses:  # the detail a table cell cannot hold: errors and where to read more
        for t in s.tasks:
            if t.state == "failed":
                console.print(f"{t.label} failed: {t.failure()}\n  log: {t.log or 'not recorded'}", style="red",
                              highlight=False, markup=False, soft_wrap=True)
            elif t.state == "running":
                console.print(f"{t.label} running since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t.started))}"
                              f" (attempt {t.attempt}; log: {t.log or 'not recorded'}); "
                              f"{describe_writer(store, t.task)}", highlight=False, markup=False, soft_wrap=True)


app = build_app()


def main() -> None:
    """The `flashdraft` console script: the typer app, with known failures reduced to one line.

    Known failures are the ones a person fixes by changing a setting or the environment (ConfigError, which
    includes a target.model that cannot be loaded, and StoreError): one line and exit 1, the traceback saved to a
    file for a bug report. Anything else is a bug in flashdraft and keeps its traceback on the terminal."""
    try:
        app()
    except Exception as exc:
        from flashdraft.storage.store import StoreError  # here, not at import: fsspec/s3fs would slow every --help

        if not isinstance(exc, ConfigError | StoreError):
            raise
        trace = _save_traceback(exc)
        typer.secho(f"{' '.join(str(exc).split())} (traceback: {trace})", fg=typer.colors.RED, err=True)
        raise SystemExit(1) from None


def _save_traceback(exc: BaseException) -> Path:
    import os
    import tempfile
    import traceback

    folder = Path(os.environ.get("FLASHDRAFT_LOG_DIR") or Path(tempfile.gettempdir()) / "flashdraft-logs")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.write_text("".join(traceback.format_exception(exc)))
    return path


if __name__ == "__main__":
    main()
