"""The local run's console channel: a task's tqdm bar becomes progress events (its final state alone reaches the
log), and the parent renders task records as one line each, progress only on a terminal."""

from __future__ import annotations

import io
import json

from rich.console import Console
from tqdm import tqdm

from flashdraft.cli.console import ConsoleView
from flashdraft.run.events import EVENTS, LOG_DIR_ENV, ProgressTee, emit
from flashdraft.run.status import StageRecord


def test_a_tqdm_bar_becomes_progress_events_and_one_final_log_line(tmp_path, monkeypatch):
    monkeypatch.setenv(LOG_DIR_ENV, str(tmp_path))
    sink = io.StringIO()
    tee = ProgressTee(sink, "train")
    sink.write("before\n")
    with tqdm(total=3, desc="train", unit="step", file=tee, disable=None, mininterval=0) as bar:  # disable=None:
        for _ in range(3):                                                     # on only for a terminal
            bar.update(1)
    tee.write("after\n")
    events = [json.loads(line) for line in (tmp_path / EVENTS).read_text().splitlines()]
    assert events and all(e["kind"] == "progress" and e["task"] == "train" for e in events)
    assert events[0]["text"].startswith("train:")
    log = sink.getvalue()
    assert "\r" not in log and log.splitlines()[0] == "before" and log.splitlines()[-1] == "after"
    assert len(log.splitlines()) == 3 and "3/3" in log.splitlines()[1], log  # only the bar's final state


def test_console_view_prints_one_line_per_task_start_and_end(tmp_path, monkeypatch):
    monkeypatch.setenv(LOG_DIR_ENV, str(tmp_path))
    out = io.StringIO()
    view = ConsoleView(Console(file=out, width=120), tmp_path)
    view.start()
    started = StageRecord(stage="extract", shard=1, state="running", started=1000.0, log="/l/extract.log")
    emit({"kind": "task", "record": started.model_dump(mode="json")})
    emit({"kind": "progress", "task": "extract-shard-00001", "text": "extract shard 1:  40%|####  | 4/10"})
    emit({"kind": "task", "record": started.model_copy(update={
        "state": "failed", "ended": 1012.5, "error_type": "ExtractionError", "error": "token id out of range"}
    ).model_dump(mode="json")})
    view.stop()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines  # not a terminal: no progress line
    assert lines[0].endswith("extract shard 1    started")
    assert "extract shard 1    FAILED    12.5 s  ExtractionError: token id out of range" in lines[1]
    assert [r.state for r in view.records] == ["running", "failed"]
