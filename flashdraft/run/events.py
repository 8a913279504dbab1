"""A local run's side channel, the task side: what a stage task sends to the terminal of `flashdraft run-local`.

Under kfp.local every task is a subprocess whose stdout/stderr kfp pipes back and prints line by line, after its
own executor dump. `run-local` points kfp's printing at a log file and each task body sends its output to its own
log file (`<task>.log`, `task_output`); what the terminal shows comes from this side channel instead: each task
appends JSON lines to `events.jsonl` (its start and end records, `emit`; the text of its live tqdm bar,
`ProgressTee`). The parent renders them (flashdraft/cli/console.py). Here, in the run layer, because the runner
writes these events for every task: the events file is the contract between the two sides.

On a cluster none of this is active (no FLASHDRAFT_LOG_DIR): pod logs stay as they are.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

LOG_DIR_ENV = "FLASHDRAFT_LOG_DIR"      # set by run-local: events go to $FLASHDRAFT_LOG_DIR/events.jsonl
TASK_LOGS_ENV = "FLASHDRAFT_TASK_LOGS"  # "1": each task writes its output to $FLASHDRAFT_LOG_DIR/<task>.log
TASK_LOG_ENV = "FLASHDRAFT_TASK_LOG"    # set inside a task: the file its output goes to (inherited by children)
EVENTS = "events.jsonl"
PROGRESS_EVERY_S = 0.5


def emit(event: dict[str, Any]) -> None:
    """Append one event for the console (a no-op outside a local run). One short line per write: appends of a
    few hundred bytes from concurrent processes do not interleave."""
    folder = os.environ.get(LOG_DIR_ENV)
    if not folder:
        return
    with open(Path(folder) / EVENTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(event, default=str) + "\n")


class ProgressTee(io.TextIOBase):
    """A task's stderr during a local run: tqdm's in-place updates (writes starting with '\\r') become progress
    events for the console, and only each bar's final state reaches the log; everything else goes to the log.

    It answers isatty() True because it is a live display (the console), so bars created with `disable=None`
    show there instead of switching themselves off."""

    def __init__(self, sink: TextIO, task: str):
        super().__init__()
        self.sink, self.task = sink, task
        self.last: str | None = None
        self.sent = 0.0

    def write(self, s: str) -> int:
        if s.startswith("\r"):
            text = s.strip()
            if text:
                self.last = text
                if time.monotonic() - self.sent >= PROGRESS_EVERY_S:
                    self.sent = time.monotonic()
                    emit({"kind": "progress", "task": self.task, "text": text})
            return len(s)
        if self.last is not None and s.startswith("\n"):
            self.sink.write(self.last)
            self.last = None
        self.sink.write(s)
        return len(s)

    def flush(self) -> None:
        self.sink.flush()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.sink.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.sink, "encoding", "utf-8")


@contextlib.contextmanager
def task_output(task: str) -> Iterator[str | None]:
    """Inside a local run's task: send this process's stdout/stderr (file descriptors, so C extensions and child
    processes follow) to `<log dir>/<task>.log`; yields that path, or None when nothing is redirected."""
    folder = os.environ.get(LOG_DIR_ENV)
    if not folder or os.environ.get(TASK_LOGS_ENV) != "1" or os.environ.get(TASK_LOG_ENV):
        yield os.environ.get(TASK_LOG_ENV)  # not local, or already inside a redirected task (producers)
        return
    path = str(Path(folder) / f"{task}.log")
    sys.stdout.flush()
    sys.stderr.flush()
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(1), os.dup(2)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ[TASK_LOG_ENV] = path
    stderr = sys.stderr
    sys.stderr = ProgressTee(stderr, task)
    try:
        yield path
    finally:
        sys.stderr = stderr
        os.environ.pop(TASK_LOG_ENV, None)
        sys.stdout.flush()
        sys.stderr.flush()
        # Restore: kfp's executor still writes its output file and last lines after the body returns.
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
