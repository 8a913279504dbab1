"""Experiment trackers (TensorBoard, MLflow, W&B): what a stage logs as it measures, behind one `Tracker`."""

from flashdraft.tracking.tracker import Tracker, flat_numbers, flat_params, log_result, open_tracker

__all__ = ["Tracker", "flat_numbers", "flat_params", "log_result", "open_tracker"]
