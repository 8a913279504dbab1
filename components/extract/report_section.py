"""What extraction adds to the run report: the features it left in the store against the plan's figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashdraft.run.reporting import RunView, StageReport, fmt, fmt_bytes
from flashdraft.run.status import NOT_RUN
from flashdraft.storage import layout

if TYPE_CHECKING:
    from flashdraft.components.extract.summary import ExtractSummary
    from flashdraft.storage.store import ObjectStore


@dataclass(frozen=True)
class StoredFeatures:
    """What extraction actually left in the store under features/."""

    objects: int
    total_bytes: int
    tokens: int | None  # as the extract shards reported
    bytes_per_token: float | None


def stored_features(store: ObjectStore, shard_metrics: list[dict[str, Any]]) -> StoredFeatures | None:
    keys = store.list(layout.FEATURES + "/")
    if not keys:
        return None
    total = sum(store.size(k) for k in keys)
    tokens = sum(int(m.get("tokens", 0) or 0) for m in shard_metrics)
    return StoredFeatures(len(keys), total, tokens or None, round(total / tokens, 1) if tokens else None)


def stored_codec(shard_metrics: list[dict[str, Any]]) -> str | None:
    """The codec(s) the extract shards stored their features with."""
    names = {str(m["codec"]["name"]) for m in shard_metrics if isinstance(m.get("codec"), dict) and
             m["codec"].get("name")}
    return ", ".join(sorted(names)) or None


def report(_: ExtractSummary | None, run: RunView) -> StageReport:
    """extract is fanned out: its figures come from every shard's metrics and from the store itself."""
    shards = run.sharded("extract")
    stored, plan = stored_features(run.store, shards), run.summary("plan")
    if plan is None and stored is None:
        return StageReport(sections=[("Storage: planned vs stored", f"plan and extract: {NOT_RUN}")])
    selected = plan.selected if plan else None
    table = [["", "planned", "stored"],
             ["codec", (plan.codec if plan else None) or "-", stored_codec(shards) or "-"],
             ["bytes/token", fmt(selected.bytes_per_token if selected else None),
              fmt(stored.bytes_per_token if stored else None)],
             ["total bytes", fmt_bytes(selected.total_bytes if selected else None),
              fmt_bytes(stored.total_bytes if stored else None)],
             ["objects", fmt(plan.objects if plan else None), fmt(stored.objects if stored else None)],
             ["tokens", fmt(plan.total_tokens if plan else None), fmt(stored.tokens if stored else None)]]
    out = StageReport(sections=[("Storage: planned vs stored", table)])
    if stored is not None:
        out.scalars = {"stored_total_bytes": float(stored.total_bytes), "stored_objects": float(stored.objects)}
        if stored.bytes_per_token is not None:
            out.scalars["stored_bytes_per_token"] = float(stored.bytes_per_token)
    return out
