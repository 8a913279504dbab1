"""The stage registry: the pipeline's stage objects in order, never mutated.

The core receives the built-in registry from the top layer (components/stages.py `BUILTIN`) through the
`flashdraft.stages` entry point, loaded the first time a registry is asked for, so `flashdraft/` imports no stage.
A test or an extension gets another registry with `builtin().with_stage(stage)` and makes it the active one for a
block with `active(registry)`; the CLI, the runner, `status`, the report and the pipeline read the active registry
through `current()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from flashdraft.config.errors import ConfigError
from flashdraft.run.contract import Stage
from flashdraft.run.stage import Pool, StageSummary

if TYPE_CHECKING:
    from flashdraft.config import RunConfig
    from flashdraft.config.pipeline import PoolConfig, PoolsConfig

ENTRY_POINTS = "flashdraft.stages"  # the group pyproject.toml's `builtin` registry is declared in


@dataclass(frozen=True)
class StageRegistry:
    """Stages in pipeline order; each stage's upstream stages come before it."""

    stages: tuple[Stage, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for stage in self.stages:
            missing = [field for field in ("name", "pool", "timeout_s") if not hasattr(stage, field)]
            if missing:
                raise ValueError(f"stage class {type(stage).__name__} declares no {', '.join(missing)}")
            if stage.name in seen:
                raise ValueError(f"stage {stage.name!r} is declared twice")
            for name in stage.upstream + (stage.streaming_upstream or ()):
                if name not in seen:
                    raise ValueError(f"stage {stage.name!r}: upstream stage {name!r} is not declared before it")
            seen.add(stage.name)
        exit_handlers = [s.name for s in self.stages if s.exit_handler]
        if len(exit_handlers) > 1:
            raise ValueError(f"stages {exit_handlers} are all declared exit_handler: a run has one")

    def with_stage(self, stage: Stage, *, after: str | None = None) -> StageRegistry:
        """A new registry with `stage` added (or replacing the stage of its name) after `after`, by default after
        the last stage before the exit handler (the report)."""
        stages = [s for s in self.stages if s.name != getattr(stage, "name", None)]  # no name: refused below
        anchor = after if after is not None else next((s.name for s in reversed(stages) if not s.exit_handler), None)
        at = next((i + 1 for i, s in enumerate(stages) if s.name == anchor), len(stages))
        return StageRegistry((*stages[:at], stage, *stages[at:]))

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages)

    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def get(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(self.names())}")

    def downstream(self, name: str) -> list[str]:
        """`name` and every stage that reads it, directly or not (in either mode), in pipeline order."""
        out = {name}
        for stage in self.stages:
            if set(stage.upstream + (stage.streaming_upstream or ())) & out:
                out.add(stage.name)
        return [s.name for s in self.stages if s.name in out]

    def upstream_in(self, stage: Stage, cfg: RunConfig) -> tuple[str, ...]:
        """The stages whose results `stage` reads in this run: its upstream stages that have a task in this run
        (`Stage.skipped_for`); when none has, the results come from further up, so theirs, recursively (extract
        reads the responses prep wrote when data.responses=dataset; evaluate reads prep's in an evaluate-only run).
        """
        ups = [self.get(name) for name in stage.upstream_for(cfg)]
        # a stage read in place from the data.features_from source run counts as present: its results exist
        present = tuple(up.name for up in ups if up.from_source(cfg) or not up.skipped_for(cfg))
        if present or not ups:
            return present
        out: list[str] = []
        for up in ups:
            out.extend(n for n in self.upstream_in(up, cfg) if n not in out)
        return tuple(out)

    def pool_name(self, pools: PoolsConfig, stage: str) -> Pool:
        """The pool `stage` runs on: the run's `pools.stage_pool` entry, else the stage's declared pool. Here, not
        in the config: the config is data and knows no stage; the registry combines the two."""
        if stage in pools.stage_pool:
            return pools.stage_pool[stage]
        try:
            return self.get(stage).pool
        except ValueError:
            raise ConfigError(f"pools.stage_pool has no entry for stage {stage!r}") from None

    def pool_config(self, pools: PoolsConfig, stage: str) -> PoolConfig:
        """The `pools` section of the pool `stage` runs on (`pool_name`)."""
        return getattr(pools, self.pool_name(pools, stage))

    def summary_of(self, stage: str, value: StageSummary | dict[str, Any]) -> StageSummary:
        """`value` as `stage`'s summary type. A model passes through; a dict (a stored metrics file, a TrainJob's
        status, a stage run by hand) is validated here, the one place such dicts become typed."""
        if isinstance(value, StageSummary):
            return value
        model = self.get(stage).summary if stage in self.names() else StageSummary
        return model.model_validate(value)


@lru_cache(maxsize=1)
def builtin() -> StageRegistry:
    """The built-in stages, from the `flashdraft.stages` entry point named `builtin` (imported on first use)."""
    from importlib.metadata import entry_points

    found = entry_points(group=ENTRY_POINTS, name="builtin")
    if not found:
        raise RuntimeError(f"no {ENTRY_POINTS!r} entry point named 'builtin': flashdraft's package metadata is "
                           "missing or stale; reinstall it (`make install`, or pip install -e .)")
    registry = next(iter(found)).load()
    if not isinstance(registry, StageRegistry):
        raise TypeError(f"the {ENTRY_POINTS!r} entry point 'builtin' is a {type(registry).__name__}, not a "
                        "StageRegistry")
    return registry


_ACTIVE: ContextVar[StageRegistry | None] = ContextVar("flashdraft_stage_registry", default=None)


def current() -> StageRegistry:
    """The registry in effect: the one `active` set for this block, else the built-in one."""
    return _ACTIVE.get() or builtin()


@contextmanager
def active(registry: StageRegistry) -> Iterator[StageRegistry]:
    """Make `registry` the one `current()` returns inside the block (tests, extensions)."""
    token = _ACTIVE.set(registry)
    try:
        yield registry
    finally:
        _ACTIVE.reset(token)
