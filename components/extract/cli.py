"""`flashdraft extract --shard K` and `flashdraft features verify`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from flashdraft.cli.options import (
    ConfigOpt,
    PresetOpt,
    SetOpt,
    ShardOpt,
    check_readable_store,
    run_config,
    run_stage,
)

features_app = typer.Typer(help="Inspect and verify stored hidden-state shards.", no_args_is_help=True)


def extract(shard: ShardOpt, config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
    """Capture the target's DFlash-layer hidden states for one generation shard into committed feature shards."""
    from flashdraft.target.model import UnsupportedTargetError

    summary = run_stage(run_config(config, preset, set_), "extract", shard, errors=(UnsupportedTargetError,))
    typer.echo(json.dumps(summary.model_dump(mode="json", exclude_unset=True, exclude={"parts"}), indent=2))


@features_app.command("verify")
def verify(
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    set_: SetOpt = None,
    samples: Annotated[int, typer.Option("--samples", "-n", help="Random stored samples to re-run.")] = 4,
    seed: Annotated[int, typer.Option(help="Which random samples.")] = 0,
    tolerance: Annotated[float | None, typer.Option(
        help="Max allowed relative RMS error per layer (default: 1e-2 for lossless codecs, 0.06 for fp8).")] = None,
) -> None:
    """Re-run stored samples through a plain HF forward; report relative RMS error per layer and checksums."""
    from flashdraft.components.extract.verify import run_verify

    cfg = run_config(config, preset, set_)
    check_readable_store(cfg)  # no credentials or a dead endpoint: one line in seconds
    report = run_verify(cfg, num_samples=samples, seed=seed, tolerance=tolerance)
    typer.echo(json.dumps(report, indent=2))
    if not report["ok"]:
        typer.secho(report["reason"], fg=typer.colors.RED, err=True)
        raise typer.Exit(1)


def register_features(app: typer.Typer) -> None:
    app.add_typer(features_app, name="features")
