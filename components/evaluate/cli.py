"""`flashdraft evaluate`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from flashdraft.cli_options import ConfigOpt, PresetOpt, SetOpt, fail, run_config


def evaluate(
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    set_: SetOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Re-evaluate even if metrics/evaluate.json is committed.")]
    = False,
) -> None:
    """Speculative decoding on held-out prompts: tau, per-position acceptance, tokens/s, lossless check."""
    from flashdraft.components.evaluate.evaluate import LosslessError, run_evaluate

    cfg = run_config(config, preset, set_)
    try:
        summary = run_evaluate(cfg, force=force)
    except (LosslessError, FileNotFoundError) as exc:
        raise fail(exc, 1) from None
    brief = summary.model_dump(mode="json", exclude_unset=True, include={"target", "drafter", "baseline", "lossless"})
    typer.echo(json.dumps(brief, indent=2))


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
