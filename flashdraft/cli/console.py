"""The local run's console, the parent side: how `flashdraft run-local`'s terminal shows its tasks.

Each task appends JSON lines to `events.jsonl` (flashdraft/run/events.py, the task side: its start and end records
and the text of its live tqdm bar); this module renders them with rich: one line per task start and end, a
transient progress line on a terminal, a summary table at the end.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from flashdraft.run.events import EVENTS
from flashdraft.run.status import REUSED, StageRecord, StageStatus, describe

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
