"""The train task's launcher: training in this process (one rank), or its ranks under torchrun, each running this
module's `main` (`python -m flashdraft.components.train.launch --config PATH`), which calls the trainer.

The train stage's `run` (components/train/stage.py) is `launch_training`, whoever holds the task: the pipeline's
train component and `flashdraft train` through the runner; a TrainJob runs the rank entry on every node. So a train
task on a pod crosses four hops: its KFP component (pipelines/stages.py `train`), the runner (`run_task`), the
train stage's run (this launcher; under torchrun, each rank's `main`), the trainer (`run_train`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from flashdraft.components.train.summary import TrainSummary
from flashdraft.config import RunConfig, dump_config, load_config

RANK_ENTRY = "flashdraft.components.train.launch"


def torchrun_command(cfg: RunConfig, config_path: str, stop_after: int | None = None) -> list[str]:
    """torchrun over `training.nproc_per_node` ranks (and `num_nodes` nodes), each running `main` on the config
    file at `config_path`."""
    t = cfg.training
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={t.nproc_per_node}",
           f"--nnodes={t.num_nodes}"]
    if t.num_nodes > 1:  # the launcher (k8s Job / JobSet) provides the rendezvous through the environment
        cmd += [f"--node_rank={os.environ.get('NODE_RANK', '0')}",
                f"--master_addr={os.environ['MASTER_ADDR']}", f"--master_port={os.environ.get('MASTER_PORT', '29500')}"]
    else:
        cmd.append("--standalone")
    cmd += ["-m", RANK_ENTRY, "--config", config_path]
    if stop_after is not None:
        cmd += ["--stop-after", str(stop_after)]
    return cmd


def write_config(cfg: RunConfig, folder: str) -> str:
    """The resolved run config as a YAML file the ranks load (`dump_config` round-trips exactly)."""
    path = Path(folder) / "config.yaml"
    path.write_text(dump_config(cfg))
    return str(path)


def run_ranks(command: list[str], cfg: RunConfig) -> TrainSummary:
    """Run the torchrun ranks here and return the summary rank 0 committed."""
    from flashdraft.components.train.trainer import TrainError
    from flashdraft.storage import layout
    from flashdraft.storage.store import open_store

    rc = subprocess.call(command)
    if rc != 0:
        raise TrainError(f"torchrun exited with status {rc} (each rank's error is in the log above it)")
    return TrainSummary.model_validate(open_store(cfg.storage, cfg.run_id).get_json_verified(
        layout.metrics_key("train")))


def launch_training(cfg: RunConfig) -> TrainSummary:
    """The train task's body on one node: the ranks under torchrun (world size > 1, or FSDP2 on any number of
    ranks) or in this process. With `training.preempt_after` (rehearsals) the ranks are launched twice: the first
    launch stops after that many steps without a final checkpoint, as a preempted pod would, and the second resumes
    from the checkpoint through the same code a restarted pod runs."""
    from flashdraft.components.train.trainer import TrainError, run_train

    stop = cfg.training.preempt_after
    # FSDP2 goes through torchrun even on one rank: a one-GPU run (make gpu-e2e) then runs the process group, the
    # sharded wrappers and their checkpoints as the cluster does.
    if cfg.training.world_size > 1 or cfg.training.strategy == "fsdp2":
        with tempfile.TemporaryDirectory() as tmp:
            path = write_config(cfg, tmp)
            if stop is not None and (rc := subprocess.call(torchrun_command(cfg, path, stop))) != 0:
                raise TrainError(f"torchrun (the launch preempted after step {stop}) exited with status {rc}")
            return run_ranks(torchrun_command(cfg, path), cfg)
    if stop is not None:
        run_train(cfg, stop_after=stop)
    return run_train(cfg)


def _rank_target(cfg: RunConfig) -> contextlib.AbstractContextManager:
    """A rank under the runner's task inherits the pinned target (flashdraft/run/target_pin.py); a TrainJob node's
    rank starts outside it and asks for the run's pinned commit itself (the embedding and head shards only, from
    the Hub: one rank per GPU copying the whole snapshot from the store would multiply the node's reads)."""
    from flashdraft.run.target_pin import pinned_target
    from flashdraft.storage.store import open_store
    from flashdraft.target.model import TARGET_ID_ENV

    if os.environ.get(TARGET_ID_ENV):
        return contextlib.nullcontext()
    return pinned_target(cfg, open_store(cfg.storage, cfg.run_id))


def main(argv: list[str] | None = None) -> int:
    """One rank of a torchrun job (launched by `launch_training`, or on every TrainJob node): train, and exit 2 with
    the error's one line when training refuses (TrainError)."""
    from flashdraft.components.train.trainer import TrainError, run_train

    parser = argparse.ArgumentParser(prog=f"python -m {RANK_ENTRY}", description=main.__doc__)
    parser.add_argument("--config", required=True, help="the run config YAML")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="end after this many optimizer steps without a final checkpoint (preempt_after)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(Path(args.config))
    try:
        with _rank_target(cfg):
            run_train(cfg, stop_after=args.stop_after)
    except TrainError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
