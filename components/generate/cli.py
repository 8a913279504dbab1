"""`flashdraft generate --shard K`: the target answers one prompt shard (cheap to import)."""

from __future__ import annotations

import json

import typer

from flashdraft.cli_options import ConfigOpt, PresetOpt, SetOpt, ShardOpt, fail, run_config


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate(shard: ShardOpt, config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
        """Generate target responses for one prompt shard, committed chunk by chunk (resumable)."""
        from flashdraft.components.generate.generate import GenerationDriftError, run_generate

        from flashdraft.store import NotCommittedError

        cfg = run_config(config, preset, set_)
        try:
            done = run_generate(cfg, shard)
        except (GenerationDriftError, NotCommittedError, ValueError) as exc:
            raise fail(exc, 1) from None
        brief = done.model_dump(mode="json", exclude_unset=True, exclude={"fingerprint"})
        typer.echo(json.dumps(brief, sort_keys=True))
