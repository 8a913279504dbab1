"""The `flashdraft` command: one sub-command per stage, each defined next to its stage in components/."""

from __future__ import annotations

import importlib

import typer

from flashdraft.cli_options import ConfigOpt, PresetOpt, SetOpt, run_config

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

if __name__ == "__main__":
    app()
