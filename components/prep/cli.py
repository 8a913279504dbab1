"""`flashdraft prep`: build the run's prompt shards (cheap to import; the work happens in prep.py)."""

from __future__ import annotations

import typer

from flashdraft.cli_options import ConfigOpt, PresetOpt, SetOpt, fail, run_config


def register(app: typer.Typer) -> None:
    @app.command("prep")
    def prep(config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
        """Read, clean, dedupe, length-filter, shuffle and shard the prompts (quarantining bad rows)."""
        from flashdraft.components.prep.prep import PrepDriftError, run_prep
        from flashdraft.components.prep.sources import SourceError

        cfg = run_config(config, preset, set_)
        try:
            summary = run_prep(cfg)
        except (SourceError, PrepDriftError) as exc:
            raise fail(exc, 1) from None
        typer.echo(summary.markdown)
