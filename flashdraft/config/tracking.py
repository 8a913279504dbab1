"""Where a run's figures go while it runs (experiment trackers), besides the store that keeps them for good."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from flashdraft.config.base import Section

Tracker = Literal["tensorboard", "mlflow", "wandb"]


class TrackingConfig(Section):
    """Experiment trackers every stage logs to as it measures (training loss, lr, accuracy per position, the
    held-out tau curve, each stage's throughput, evaluate's tau and speedup). A tracker that fails is a warning, never
    a failed stage: the store's metrics/ stay the record. MLflow reads MLFLOW_TRACKING_URI (and
    MLFLOW_EXPERIMENT_NAME), W&B its WANDB_* variables (docs/tracking.md)."""

    report_to: list[Tracker] = Field(
        default_factory=lambda: ["tensorboard"], description="trackers to log to: tensorboard (event files in the "
        "run's store under tensorboard/), mlflow, wandb; [] for none")
    flush_every_s: float = Field(default=30.0, gt=0, description="seconds between copies of the TensorBoard event "
                                 "files into the store while a stage runs (and at its end)")

    @field_validator("report_to")
    @classmethod
    def _no_repeats(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"tracking.report_to names a tracker twice: {value}")
        return value
