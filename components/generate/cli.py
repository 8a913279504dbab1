"""`flashdraft generate --shard K`: the target answers one prompt shard (cheap to import)."""

from __future__ import annotations

import json

import typer

from flashdraft.cli.options import ConfigOpt, PresetOpt, SetOpt, ShardOpt, run_config, run_stage


def generate(shard: ShardOpt, config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
    """Generate target responses for one prompt shard, committed chunk by chunk (resumable)."""
    from flashdraft.storage.store import NotCommittedError

    done = run_stage(run_config(config, preset, set_), "generate", shard, errors=(NotCommittedError, ValueError))
    typer.echo(json.dumps(done.dump(), sort_keys=True))
