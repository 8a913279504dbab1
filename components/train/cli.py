"""`flashdraft train`: run training here, or re-launch this same command under torchrun when
training.nproc_per_node > 1 (each rank then runs `run_train`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Annotated

import typer

from flashdraft.cli.options import ConfigOpt, PresetOpt, SetOpt, fail, run_config, run_stage
from flashdraft.components.train.summary import TrainSummary


def torchrun_command(cfg, config, preset, sets, stop_after: int | None = None) -> list[str]:
    t = cfg.training
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={t.nproc_per_node}",
           f"--nnodes={t.num_nodes}"]
    if t.num_nodes > 1:  # the launcher (k8s Job / JobSet) provides the rendezvous through the environment
        cmd += [f"--node_rank={os.environ.get('NODE_RANK', '0')}",
                f"--master_addr={os.environ['MASTER_ADDR']}", f"--master_port={os.environ.get('MASTER_PORT', '29500')}"]
    else:
        cmd.append("--standalone")
    cmd += ["-m", "flashdraft.cli.main", "train"]
    if config:
        cmd += ["--config", str(config)]
    if preset:
        cmd += ["--preset", preset]
    for s in sets or []:
        cmd += ["--set", s]
    if stop_after is not None:
        cmd += ["--stop-after", str(stop_after)]
    return cmd


def run_ranks(command: list[str], cfg) -> TrainSummary:
    """Run the torchrun ranks here and return the summary rank 0 committed."""
    from flashdraft.components.train.trainer import TrainError
    from flashdraft.storage import layout
    from flashdraft.storage.store import open_store

    rc = subprocess.call(command)
    if rc != 0:
        raise TrainError(f"torchrun exited with status {rc} (each rank's error is in the log above it)")
    return TrainSummary.model_validate(open_store(cfg.storage, cfg.run_id).get_json_verified(
        layout.metrics_key("train")))


def launch_training(cfg, config=None, preset=None, sets=None) -> TrainSummary:
    """The train task's body on one node: the ranks under torchrun (world size > 1, or FSDP2 on any number of
    ranks; `config`/`preset`/`sets` say how they load the run's config) or in this process. With
    `training.preempt_after` (rehearsals) the ranks are launched twice: the first launch stops after that many
    steps without a final checkpoint, as a preempted pod would, and the second resumes from the checkpoint through
    the same code a restarted pod runs."""
    from flashdraft.components.train.trainer import TrainError, run_train

    stop = cfg.training.preempt_after
    # FSDP2 goes through torchrun even on one rank: a one-GPU run (make gpu-e2e) then runs the process group, the
    # sharded wrappers and their checkpoints as the cluster does.
    if cfg.training.world_size > 1 or cfg.training.strategy == "fsdp2":
        if stop is not None and (rc := subprocess.call(torchrun_command(cfg, config, preset, sets, stop))) != 0:
            raise TrainError(f"torchrun (the launch preempted after step {stop}) exited with status {rc}")
        return run_ranks(torchrun_command(cfg, config, preset, sets), cfg)
    if stop is not None:
        run_train(cfg, stop_after=stop)
    return run_train(cfg)


StopAfterOpt = Annotated[int | None, typer.Option(
    "--stop-after", hidden=True, help="end after this many optimizer steps without a final checkpoint "
    "(training.preempt_after's first launch)")]


def train(config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None,
          stop_after: StopAfterOpt = None) -> None:
    """Train the drafter on the run's feature shards (resumes from the latest checkpoint)."""
    from flashdraft.components.train.trainer import TrainError, run_train

    cfg = run_config(config, preset, set_)
    if "LOCAL_RANK" in os.environ or cfg.training.num_nodes > 1:
        # One rank of a torchrun job (or a TrainJob node): whoever launched the job (this command on one node,
        # the pipeline's train task or TrainJob launcher) runs the task through the runner.
        if "LOCAL_RANK" not in os.environ:
            raise typer.Exit(subprocess.call(torchrun_command(cfg, config, preset, set_)))
        try:
            summary = run_train(cfg, stop_after=stop_after)
        except TrainError as exc:
            raise fail(exc, 2) from None
    else:
        summary = run_stage(cfg, "train", body=lambda: launch_training(cfg, config, preset, set_),
                            errors=(TrainError,))
    if int(os.environ.get("RANK", "0")) == 0:
        typer.echo(json.dumps({k: v for k, v in summary.dump().items() if k != "history"}))

