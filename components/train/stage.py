"""The train stage: the drafter trained on the run's features (registered in components/stages.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flashdraft.components.train.summary import TrainSummary
from flashdraft.run.contract import Stage
from flashdraft.run.stage import HOUR, TARGET_HINTS
from flashdraft.storage.layout import STAGE_OUTPUTS

if TYPE_CHECKING:
    from flashdraft.config import RunConfig
    from flashdraft.run.reporting import RunView, StageReport


class Train(Stage):
    name = "train"
    summary = TrainSummary
    pool = "trainer"
    timeout_s = 7 * 24 * HOUR
    target_use = "fetch"
    upstream = ("extract",)
    streaming_upstream = ("generate",)
    trains = True
    doc = "Train the drafter on the run's feature shards (resumes from the latest checkpoint)."
    reads = ("target", "features.layer_ids", "features.num_features", "drafter", "training", "mode")
    ignores = (*TARGET_HINTS, "training.num_threads", "training.feature_decode", "training.checkpoint_every",
               "training.preempt_after", "mode.window_bytes", "mode.window_shards")
    # streaming: the consumed parts are gone, so there is nothing to train on from a finished stream
    continue_on = ("training.max_steps", "training.epochs")
    streaming_continue_on = ()
    commits_result = True  # rank 0 commits metrics/train.json
    outputs = STAGE_OUTPUTS["train"]

    def run(self, cfg: RunConfig, shard: int | None = None) -> TrainSummary:
        """Its launcher: the ranks in this process or under torchrun (components/train/launch.py)."""
        from flashdraft.components.train.launch import launch_training

        return launch_training(cfg)

    def command(self) -> Callable[..., None]:
        from flashdraft.components.train.cli import train

        return train

    def report(self, summary: TrainSummary | None, run: RunView) -> StageReport:
        from flashdraft.components.train.report_section import report

        return report(summary, run)
