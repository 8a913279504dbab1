"""`flashdraft train`: the train task through the runner here (the train stage's launcher runs its ranks under
torchrun when training.nproc_per_node > 1; components/train/launch.py)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from typing import Annotated

import typer

from flashdraft.cli.options import ConfigOpt, PresetOpt, SetOpt, fail, run_config, run_stage

StopAfterOpt = Annotated[int | None, typer.Option(
    "--stop-after", hidden=True, help="end after this many optimizer steps without a final checkpoint "
    "(training.preempt_after's first launch)")]


def train(config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None,
          stop_after: StopAfterOpt = None) -> None:
    """Train the drafter on the run's feature shards (resumes from the latest checkpoint)."""
    from flashdraft.components.train.launch import torchrun_command, write_config
    from flashdraft.components.train.trainer import TrainError, run_train

    cfg = run_config(config, preset, set_)
    if "LOCAL_RANK" in os.environ:  # one rank of a torchrun job someone else launched: it holds the task
        try:
            summary = run_train(cfg, stop_after=stop_after)
        except TrainError as exc:
            raise fail(exc, 2) from None
    elif cfg.training.num_nodes > 1:  # one node of a multi-node job: its ranks, under torchrun
        with tempfile.TemporaryDirectory() as tmp:
            raise typer.Exit(subprocess.call(torchrun_command(cfg, write_config(cfg, tmp))))
    else:
        summary = run_stage(cfg, "train", errors=(TrainError,))
    if int(os.environ.get("RANK", "0")) == 0:
        typer.echo(json.dumps({k: v for k, v in summary.dump().items() if k != "history"}))
