"""The train stage's declaration (read by the registry, flashdraft/run/registry.py)."""

from flashdraft.components.train.summary import TrainSummary
from flashdraft.run.stage import HOUR, TARGET_HINTS, StageSpec

SPEC = StageSpec(
    "train", TrainSummary, "trainer", 7 * 24 * HOUR, run="flashdraft.components.train.trainer:run_train",
    upstream=("extract",), streaming_upstream=("generate",), trains=True,
    doc="Train the drafter on the run's feature shards (resumes from the latest checkpoint).",
    reads=("target", "features.layer_ids", "features.num_features", "drafter", "training", "mode"),
    ignores=(*TARGET_HINTS, "training.num_threads", "training.feature_decode", "training.checkpoint_every",
             "training.preempt_after", "mode.window_bytes", "mode.window_shards"),
    # streaming: the consumed parts are gone, so there is nothing to train on from a finished stream
    continue_on=("training.max_steps", "training.epochs"), streaming_continue_on=(), commits_result=True,
    outputs=("checkpoints/", "metrics/stream.json"), report="flashdraft.components.train.report_section:report",
    cli="flashdraft.components.train.cli:train",
    component="flashdraft.pipelines.stages:train")
