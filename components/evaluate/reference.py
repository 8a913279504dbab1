"""Published figures to show beside each suite (`eval.reference`), read once by evaluate and stored with each
suite's row in metrics/evaluate.json, so the report and `flashdraft status` need not find the file again.

A reference file is JSON, either a plain `{suite: tau}` object (labelled with the file name), or one reference /
a list of references:

    {"label": "DFlash, Qwen3-8B", "source": "where the numbers come from", "target": "Qwen/Qwen3-8B",
     "thinking": false, "suites": {"gsm8k": 6.34, "math500": {"tau": 7.91, "speedup": 4.59}}}

Suite keys match `eval.suites` names (case-insensitive; `-`, `_` and `.` ignored, so `math-500` matches
`math500`). `builtin:published` is the shipped file (components/evaluate/published_tau.json: DFlash and DFlash2 on
Qwen3-8B and the 27B Qwen drafters, each with its source). A malformed file fails evaluate before decoding,
naming the file and the entry.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from flashdraft.config import StorageConfig

BUILTIN = "builtin:published"


class ReferenceError(ValueError):
    """An unreadable or malformed reference file; the message names the file and the entry."""


def suite_key(name: str) -> str:
    return re.sub(r"[-_.\s]", "", name.lower())


def _read(uri: str, storage: StorageConfig) -> Any:
    if uri == BUILTIN:
        text = resources.files("flashdraft.components.evaluate").joinpath("published_tau.json").read_text()
    else:
        from flashdraft.components.prep.sources import SourceError, read_bytes

        try:
            text = read_bytes(uri.removeprefix("file://") if uri.startswith("file://") else uri, storage).decode()
        except SourceError as exc:
            raise ReferenceError(f"eval.reference: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReferenceError(f"eval.reference {uri}: not JSON ({exc})") from None


def _figure(value: Any, where: str) -> dict[str, float]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"tau": float(value)}
    if isinstance(value, dict) and isinstance(value.get("tau"), int | float):
        return {k: float(value[k]) for k in ("tau", "speedup") if isinstance(value.get(k), int | float)}
    raise ReferenceError(f"{where}: expected a tau number or an object with a 'tau' number, got {value!r}")


def load_reference(uri: str | None, storage: StorageConfig) -> list[dict[str, Any]]:
    """Every published figure as {label, source, target, thinking, suite (key), tau, speedup?}."""
    if not uri:
        return []
    doc = _read(uri, storage)
    if isinstance(doc, dict) and "suites" not in doc and "references" not in doc:
        doc = {"label": uri.rsplit("/", 1)[-1], "suites": doc}
    entries = doc.get("references", doc) if isinstance(doc, dict) else doc
    entries = [entries] if isinstance(entries, dict) else entries
    if not isinstance(entries, list):
        raise ReferenceError(f"eval.reference {uri}: expected an object or a list of references")
    out = []
    for i, entry in enumerate(entries):
        where = f"eval.reference {uri} entry {i}"
        if not isinstance(entry, dict) or not isinstance(entry.get("suites"), dict):
            raise ReferenceError(f"{where}: expected an object with a 'suites' mapping of suite -> tau")
        for suite, value in entry["suites"].items():
            out.append({"label": str(entry.get("label", f"reference {i}")), "source": entry.get("source"),
                        "target": entry.get("target"), "thinking": entry.get("thinking"),
                        "suite": suite_key(suite), **_figure(value, f"{where} suite {suite}")})
    return out


def published_for(reference: list[dict[str, Any]], suite: str) -> list[dict[str, Any]]:
    """The published figures whose suite matches `suite` (without the matching key)."""
    key = suite_key(suite)
    return [{k: v for k, v in r.items() if k != "suite" and v is not None} for r in reference if r["suite"] == key]
