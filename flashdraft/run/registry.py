"""The stage registry: the pipeline's stages in order, built once from lazy references and never mutated.

`BUILTIN_STAGES` names each built-in stage's declaration ("module:attribute"); they are imported the first time a
registry is asked for, so core `flashdraft/` imports no stage at import time. A test or an extension gets another
registry with `builtin().with_stage(spec)` and makes it the active one for a block with `active(registry)`; the
CLI, the runner, `status`, the report and the pipeline read the active registry through `current()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from flashdraft.config.errors import ConfigError
from flashdraft.run.stage import Pool, StageSpec, StageSummary, load_ref

if TYPE_CHECKING:
    from flashdraft.config.pipeline import PoolConfig, PoolsConfig

BUILTIN_STAGES = tuple(f"flashdraft.components.{package}.stage:SPEC" for package in (
    "plan", "prep", "generate", "extract", "stream_end", "train", "evaluate", "export", "report"))


@dataclass(frozen=True)
class StageRegistry:
    """Stages in pipeline order; each stage's upstream stages come before it."""

    specs: tuple[StageSpec, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for spec in self.specs:
            if spec.name in seen:
                raise ValueError(f"stage {spec.name!r} is declared twice")
            for name in spec.upstream + (spec.streaming_upstream or ()):
                if name not in seen:
                    raise ValueError(f"stage {spec.name!r}: upstream stage {name!r} is not declared before it")
            seen.add(spec.name)
        exit_handlers = [s.name for s in self.specs if s.exit_handler]
        if len(exit_handlers) > 1:
            raise ValueError(f"stages {exit_handlers} are all declared exit_handler: a run has one")

    @classmethod
    def from_refs(cls, refs: tuple[str, ...]) -> StageRegistry:
        return cls(tuple(load_ref(ref) for ref in refs))

    def with_stage(self, spec: StageSpec, *, after: str | None = None) -> StageRegistry:
        """A new registry with `spec` added (or replacing the stage of its name) after `after`, by default after
        the last stage before the exit handler (the report)."""
        specs = [s for s in self.specs if s.name != spec.name]
        anchor = after if after is not None else next((s.name for s in reversed(specs) if not s.exit_handler), None)
        at = next((i + 1 for i, s in enumerate(specs) if s.name == anchor), len(specs))
        return StageRegistry((*specs[:at], spec, *specs[at:]))

    def __iter__(self) -> Iterator[StageSpec]:
        return iter(self.specs)

    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def get(self, name: str) -> StageSpec:
        for spec in self.specs:
            if spec.name == name:
                return spec
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(self.names())}")

    def downstream(self, name: str) -> list[str]:
        """`name` and every stage that reads it, directly or not (in either mode), in pipeline order."""
        out = {name}
        for spec in self.specs:
            if set(spec.upstream + (spec.streaming_upstream or ())) & out:
                out.add(spec.name)
        return [s.name for s in self.specs if s.name in out]

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
    """The built-in stages (imported on first use)."""
    return StageRegistry.from_refs(BUILTIN_STAGES)


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
