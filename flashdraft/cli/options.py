"""Options the commands share: which config, which preset, which overrides; for commands that read a finished or
running run (status, report), which run store."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flashdraft.config import ConfigError, RunConfig, StorageConfig, load_config, preset_names

# flashdraft.storage.store (fsspec, s3fs) and the runner, which imports it, are imported in the functions that use them:
# at import they would slow every --help.
if TYPE_CHECKING:
    from flashdraft.storage.store import ObjectStore

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="Run config YAML (merged over --preset).")]
# The list is read from the presets folder (flashdraft/config/presets/*.yaml), so a new preset shows without an edit
# here.
PresetOpt = Annotated[str | None, typer.Option("--preset", "-p", help=f"Packaged preset: {', '.join(preset_names())} "
                                                                      "(`flashdraft presets`).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a config field, e.g. --set "
                                                                      "training.lr=3e-4 (repeatable; every field: "
                                                                      "`flashdraft config-reference [SECTION]` or "
                                                                      "docs/config-reference.md).")]
# Required on every per-shard command (generate, extract, a declared per-shard stage): each shard is its own task
# and every preset has several, so a default would silently do one shard of many (docs/stages.md).
ShardOpt = Annotated[int, typer.Option("--shard", min=0, help="Shard this task works on: 0 to data.num_shards - 1 "
                                                              "(required; each shard is its own task).")]
RunOpt = Annotated[str | None, typer.Option("--run", help="Run store URI, e.g. file:///data/runs/tiny or "
                                                          "s3://bucket/flashdraft/my-run.")]
EndpointOpt = Annotated[str | None, typer.Option("--endpoint-url", help="S3 endpoint for --run.")]


def fail(exc: BaseException | str, code: int = 1) -> typer.Exit:
    """Print a user-facing error in red on stderr and return the Exit to raise (no traceback for user mistakes)."""
    typer.secho(str(exc), fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def run_store(run: str, endpoint_url: str | None) -> ObjectStore:
    """The store of `--run RUN_URI` (S3 credentials from the environment, as for every store), after the read
    preflight (`flashdraft.storage.store.check_readable`): no credentials or a dead endpoint ends the command in one
    line within seconds. Opened read-only: a give-up advises running the command again, not rerunning a stage."""
    from pydantic import ValidationError

    from flashdraft.storage.store import ObjectStore, check_readable

    try:
        storage = StorageConfig(root=run, endpoint_url=endpoint_url)
    except ValidationError as exc:  # an unsupported scheme
        raise fail(f"--run {run}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}", 1) from None
    _quietly(lambda: check_readable(storage, setting="--run", endpoint_setting="--endpoint-url"))
    return ObjectStore(run, storage, read_only=True)


def check_readable_store(cfg: RunConfig) -> None:
    """The read preflight for a command that inspects the configured run (status, features verify)."""
    from flashdraft.storage.store import check_readable

    _quietly(lambda: check_readable(cfg.storage, cfg.run_id))


def run_stage(cfg: RunConfig, stage: str, shard: int | None = None, *, body: Callable[[], Any] | None = None,
              force: bool = False, errors: tuple[type[BaseException], ...] = ()) -> Any:
    """`flashdraft <stage>`: the store preflight (`check_store`), then the task through the runner
    (flashdraft/run/runner.py), as a pipeline runs it. A store that cannot be used, a refused change
    (StageInputsChanged), a config error or one of the stage's own `errors` ends in one red line, exit 1."""
    from flashdraft.run.runner import run_task
    from flashdraft.storage.store import StoreError

    check_store(cfg)  # before the stage works: a bad store fails in seconds, in one line
    known = (ConfigError, StoreError, *errors)
    quiet = _KnownFailureFilter(known)
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        return run_task(cfg, stage, shard, body=body, force=force)
    except (ConfigError, *errors) as exc:
        raise fail(exc, 1) from None
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


class _KnownFailureFilter(logging.Filter):
    """Keeps the runner's "<task> failed" record and its traceback off the terminal when the failure is a known
    one (a setting or the environment to fix): the command ends with that error in one red line, and `main`
    saves the traceback of a StoreError to a file. A pipeline pod runs the task without this filter, so its log
    keeps the traceback."""

    def __init__(self, known: tuple[type[BaseException], ...]):
        super().__init__()
        self.known = known

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], self.known))


def run_config(config: Path | None, preset: str | None, sets: list[str] | None) -> RunConfig:
    """Load the config or exit 1 with the validation message (no traceback for a user's mistake)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return load_config(config, preset, sets or [])
    except ConfigError as exc:
        raise fail(exc, 1) from None


def check_store(cfg: RunConfig) -> None:
    """The store preflight (`flashdraft.storage.store.preflight`) before a command starts any work: credentials, server,
    bucket and a probe commit, in seconds; a failure exits 1 with one line naming the setting to fix."""
    from flashdraft.storage.store import preflight

    _quietly(lambda: preflight(cfg.storage, cfg.run_id))


def _quietly(check: Callable[[], None]) -> None:
    """Run a store preflight; its failure exits 1 with its one line."""
    from flashdraft.storage.store import StorePreflightError

    # The probe's own chatter (botocore's "found credentials", the store's retry warning) would bury the verdict.
    quiet = [logging.getLogger(name) for name in ("botocore", "aiobotocore", "flashdraft.storage.store")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        check()
    except StorePreflightError as exc:
        raise fail(exc, 1) from None
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)

