"""The JSON-lines protocol between a stage and its vLLM worker subprocess (generate and extract both use it).

vLLM's `LLM(...)` must be created under a `__main__` guard and, on CPU machines, lives in its own venv, so each
stage runs its engine as `python -m <worker module>` and talks to it over stdin/stdout. Standard library only:
the worker interpreter has vLLM but not necessarily the rest of flashdraft's dependencies.

First line in: the engine config; first line out: `{"ready": true, "startup_s": ...}`. Then one request per
line, answered by the handler's dict plus `"seconds"`. EOF ends the worker. Anything vLLM prints goes to stderr,
so stdout carries only protocol lines.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any


def serve(make_engine: Callable[[dict], Any], handle: Callable[[Any, dict], dict]) -> None:
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def send(obj: dict) -> None:
        protocol.write(json.dumps(obj) + "\n")
        protocol.flush()

    t0 = time.time()
    engine = make_engine(json.loads(sys.stdin.readline()))
    send({"ready": True, "startup_s": round(time.time() - t0, 2)})
    for line in sys.stdin:
        if line.strip():
            t = time.time()
            send({**handle(engine, json.loads(line)), "seconds": round(time.time() - t, 4)})
