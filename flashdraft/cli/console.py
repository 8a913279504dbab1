"""The local run's console: what a stage task reports to the terminal, and how the terminal shows it.

Under kfp.local every task is a subprocess whose stdout/stderr kfp pipes back and prints line by line, after its
own executor dump (the whole `executor_input`). `flashdraft run-local` therefore points kfp's printing at a log
file (`kfp-local.log` in the run's log folder) and each task body sends its output to its own log file there
(`<task>.log`). What the terminal shows comes from a small side channel instead: each task appends JSON lines to
`events.jsonl` (its start and end records, and the text of its live tqdm bar), and the parent renders them with
rich: one line per task start and end, a transient progress line on a terminal, a summary table at the end.

On a cluster none of this is active (no FLASHDRAFT_LOG_DIR): pod logs stay as they are.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from flashdraft.run.status import REUSED, StageRecord, StageStatus, describe

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


# -- the parent's view ------------------------------------------------------------------------------------------


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def record_line(r: StageRecord) -> str:
    """The console line of a task's start or end."""
    name = f"{r.label:<18}"
    if r.state == "running":
        return f"{_clock(r.started)}  {name} started"
    took = f"{r.duration_s:7.1f} s" if r.duration_s is not None else ""
    if r.state == "failed":
        return f"{_clock(r.ended or r.started)}  {name} FAILED {took}  {r.failure()}"
    if r.reused:
        return f"{_clock(r.reused_at or r.ended or r.started)}  {name} reused {took}  {REUSED}; {r.headline}".rstrip()
    return f"{_clock(r.ended or r.started)}  {name} done   {took}  {r.headline}".rstrip()


class ConsoleView(threading.Thread):
    """Tails `events.jsonl` and renders it: start/end lines as they come, the running task's tqdm bar as one
    transient line (only on a terminal). `stop()` drains what is left."""

    def __init__(self, console, log_dir: Path):
        super().__init__(daemon=True, name="console-view")
        self.console, self.path = console, log_dir / EVENTS
        self.path.touch()
        self.records: list[StageRecord] = []
        self._halt = threading.Event()
        self._offset = 0
        self._live = None
        if console.is_terminal:
            from rich.live import Live
            from rich.text import Text

            self._live = Live(Text(""), console=console, transient=True, refresh_per_second=4)

    def _drain(self) -> None:
        from rich.text import Text

        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # only complete lines
        self._offset += end
        for line in chunk[:end].decode("utf-8", errors="replace").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("kind") == "progress":
                if self._live is not None:
                    self._live.update(Text(f"  {event['text']}"[: self.console.width - 1]))
                continue
            record = StageRecord.model_validate(event["record"])
            self.records.append(record)
            if self._live is not None and record.state != "running":
                self._live.update(Text(""))
            style = {"failed": "bold red", "done": "green"}.get(record.state)
            self.console.print(record_line(record), style=style, highlight=False, markup=False, soft_wrap=True)

    def run(self) -> None:
        if self._live is not None:
            self._live.start()
        while not self._halt.is_set():
            self._drain()
            self._halt.wait(0.2)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self._drain()
        if self._live is not None:
            self._live.stop()


def summary_table(statuses: list[StageStatus]):
    """The run's stage table (the report's "Run" rows): state, wall time and headline of every stage."""
    from rich.table import Table

    table = Table(title="flashdraft run", title_justify="left", show_lines=False, expand=False)
    table.add_column("stage")
    table.add_column("state")
    table.add_column("time", justify="right")
    table.add_column("figures")
    for s in statuses:
        state = describe(s) if s.state != "failed" else "failed"
        took = f"{s.duration_s:.0f} s" if s.duration_s is not None else ""
        style = {"failed": "red", "not run": "dim"}.get(s.state)
        table.add_row(s.stage, state, took, s.headline, style=style)
    return table
