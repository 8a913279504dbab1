"""The check framework: a row per compared (or informational) quantity, one table, pass iff every limit holds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Check:
    name: str
    value: float | None   # the compared quantity (None: informational row)
    limit: float | None   # pass iff value <= limit; None: informational
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.limit is None or (self.value is not None and math.isfinite(self.value) and
                                      self.value <= self.limit)


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, value: float | None, limit: float | None = None, detail: str = "") -> Check:
        c = Check(name, value, limit, detail)
        self.checks.append(c)
        return c

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def table(self) -> str:
        rows = [("check", "value", "limit", "result", "detail")]
        for c in self.checks:
            rows.append((c.name, "-" if c.value is None else f"{c.value:.4g}",
                         "-" if c.limit is None else f"{c.limit:.4g}",
                         "info" if c.limit is None else ("ok" if c.ok else "FAIL"), c.detail))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)
