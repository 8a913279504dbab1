"""Options every stage command shares: which config, which preset, which overrides."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from flashdraft.config import ConfigError, RunConfig, load_config

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="Run config YAML (merged over --preset).")]
PresetOpt = Annotated[str | None, typer.Option("--preset", "-p", help="Packaged preset: tiny, smollm2-local, "
                                                                      "qwen3.6-27b.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override, e.g. --set training.lr=3e-4 "
                                                                      "(repeatable).")]
ShardOpt = Annotated[int, typer.Option("--shard", help="Shard index this invocation works on.")]


def fail(exc: BaseException | str, code: int = 1) -> typer.Exit:
    """Print a user-facing error in red on stderr and return the Exit to raise (no traceback for user mistakes)."""
    typer.secho(str(exc), fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def run_config(config: Path | None, preset: str | None, sets: list[str] | None) -> RunConfig:
    """Load the config or exit with the validation message (no traceback for a user's mistake)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return load_config(config, preset, sets or [])
    except ConfigError as exc:
        raise fail(exc, 2) from None
