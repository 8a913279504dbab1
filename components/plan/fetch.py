"""The plan's price of the target's one fetch (flashdraft/run/target_pin.py, docs/cluster.md "Model cache"): the
pinned snapshot comes from the Hub once per run, into the run's store, and every pod that loads the target reads it
from there. The plan counts the bytes, the minutes at `plan.hub_bandwidth_gbps`, and the Hub downloads the cache
saves (one per pod that loads the target)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from flashdraft.components.plan.memory import WEIGHT_BYTES
from flashdraft.config import RunConfig
from flashdraft.target.snapshot import local_folder


class FetchPlan(BaseModel):
    """The target's fetch: what it moves once, and what it saves."""

    bytes: int = Field(description="the target's weights in plan.target_precision (the snapshot's size)")
    minutes: float = Field(description="the one Hub download at plan.hub_bandwidth_gbps")
    pods: int = Field(description="tasks that load the target (prep, generate and extract shards, train, "
                                  "evaluate, export), each reading the snapshot from the run's store")
    hub_bytes_saved: int = Field(description="Hub egress the cache saves: (pods - 1) x bytes")

    def line(self) -> str:
        return (f"target fetch: {self.bytes / 1e9:,.1f} GB once from the Hub (~{self.minutes:,.1f} min), read "
                f"from the run's store by {self.pods} tasks ({self.hub_bytes_saved / 1e12:,.2f} TB of Hub "
                "downloads saved)")


def fetch_plan(cfg: RunConfig, params: float) -> FetchPlan | None:
    """The fetch of a Hub target; None for a local folder or a target flashdraft builds (nothing to fetch)."""
    if cfg.target.source != "hf" or local_folder(cfg.target) is not None:
        return None
    size = int(params * WEIGHT_BYTES[cfg.plan.target_precision])
    shards = cfg.data.num_shards
    generate = 0 if cfg.data.responses == "dataset" else shards
    pods = 2 if cfg.evaluate_only else 1 + generate + shards + 3  # (prep, shards, train,) evaluate, export
    minutes = size / (cfg.plan.hub_bandwidth_gbps * 1e9) / 60
    return FetchPlan(bytes=size, minutes=round(minutes, 1), pods=pods, hub_bytes_saved=(pods - 1) * size)
