"""`flashdraft prep`: build the run's prompt shards (cheap to import; the work happens in prep.py)."""

from __future__ import annotations

import typer

from flashdraft.cli.options import ConfigOpt, PresetOpt, SetOpt, run_config, run_stage


def prep(config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
    """Read, clean, dedupe, length-filter, shuffle and shard the prompts (quarantining bad rows)."""
    from flashdraft.components.prep.sources import SourceError

    summary = run_stage(run_config(config, preset, set_), "prep", errors=(SourceError,))
    typer.echo(summary.markdown)
