"""`flashdraft evaluate`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from flashdraft.cli.options import ConfigOpt, PresetOpt, SetOpt, run_config, run_stage


def evaluate(
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    set_: SetOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Re-evaluate even when the committed result's "
                                                       "fingerprint matches.")]
    = False,
) -> None:
    """Speculative decoding on every eval suite: tau, per-position acceptance, tokens/s, lossless check."""
    from flashdraft.components.evaluate.evaluate import LosslessError
    from flashdraft.components.evaluate.reference import ReferenceError
    from flashdraft.components.evaluate.suites import SuiteError

    summary = run_stage(run_config(config, preset, set_), "evaluate", force=force,
                        errors=(LosslessError, FileNotFoundError, SuiteError, ReferenceError))
    brief = summary.model_dump(mode="json", exclude_unset=True, include={"target", "drafter", "baseline", "lossless"})
    typer.echo(json.dumps(brief, indent=2))
    typer.echo(summary.suite_table_text())

