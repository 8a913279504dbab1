"""Hub datasets (`hf:<dataset id>` prompt sources and eval suites) read through `datasets` as a cluster pod reads
them: the endpoint from HF_ENDPOINT (huggingface.co, or an air-gapped cluster's own mirror), the token from
HF_TOKEN, both from the environment only (never from the config, so never in a parameter or a log).

A dataset is read at one commit: `resolve_commit` turns the entry's revision (None = main) into the commit sha
once per process, and every read of that entry in the process uses the sha, so the rows prep reads are the rows
its record names even if the branch moves meanwhile. `describe` is the plan gate's look: the configs, the splits
of the chosen config and their row counts where the card gives them. Every failure is one line (`HubError`) that
names what to change: a missing config or split lists the ones that exist; a gated or private dataset names
HF_TOKEN.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flashdraft.config.target import HubDataset

DEFAULT_REVISION = "main"  # the Hub's default branch; olah-style mirrors answer only a named revision


class HubError(RuntimeError):
    """A Hub dataset that cannot be read as configured; the message is one line (without the entry's name: the
    caller says which source or suite)."""


class HubUnreachable(HubError):
    """HF_ENDPOINT does not answer: every other entry would fail the same way."""


def dataset_id(uri: str) -> str:
    return uri.removeprefix("hf:")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _access_line(exc: BaseException, name: str) -> str | None:
    """The one line for a refused Hub request, or None for another failure; raises HubUnreachable for an endpoint
    that does not answer."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    token = "HF_TOKEN" in os.environ
    for cause in _causes(exc):
        if isinstance(cause, GatedRepoError) or "is a gated dataset" in str(cause):
            return (f"{name} is gated on {endpoint()}: " + ("HF_TOKEN's account has not been granted access (accept "
                    "the dataset's terms on its page)" if token else "set HF_TOKEN to a token of an account that "
                    "accepted its terms"))
        if isinstance(cause, RevisionNotFoundError):
            return f"{name}: revision not found on {endpoint()}"
        if isinstance(cause, RepositoryNotFoundError) or "doesn't exist on the Hub or cannot be accessed" in str(cause):
            return (f"{name} not found on {endpoint()}" + (" (or HF_TOKEN's account cannot see it)" if token else
                    " (a private or gated dataset needs HF_TOKEN set)"))
        if isinstance(cause, ConnectionError | TimeoutError) or type(cause).__name__ in ("ConnectError",
                                                                                         "ConnectTimeout"):
            raise HubUnreachable(f"cannot reach {endpoint()} for {name} ({cause}); HF_ENDPOINT names the Hub or its "
                                 "mirror")
    return None


def hub_error(exc: BaseException, name: str) -> HubError:
    """`exc` from huggingface_hub or datasets as one line: access first, then datasets' own config / split
    messages (they list what exists), else the first line of the message."""
    try:
        line = _access_line(exc, name)
    except HubUnreachable as unreachable:
        return unreachable
    if line is None:
        text = " ".join(str(exc).split("\n")[:2]) if "Config name is missing" in str(exc) else str(exc)
        line = f"{name}: {text.splitlines()[0] if text else type(exc).__name__}"
    return HubError(line)


@functools.lru_cache(maxsize=256)
def resolve_commit(uri: str, revision: str | None) -> str:
    """The commit sha `revision` (None = main) of dataset `uri` names now; the same answer for the whole process."""
    from huggingface_hub import HfApi

    name = dataset_id(uri)
    try:
        return HfApi(endpoint=endpoint()).dataset_info(name, revision=revision or DEFAULT_REVISION).sha
    except Exception as exc:  # noqa: BLE001 (every failure becomes one line)
        raise hub_error(exc, name if revision is None else f"{name}@{revision}") from None


def iter_rows(spec: HubDataset, uri: str) -> Iterator[dict[str, Any]]:
    """Every row of the entry's splits, in order, streamed at the resolved commit."""
    import datasets

    name, sha = dataset_id(uri), resolve_commit(uri, spec.revision)
    for split in spec.split_names:
        try:
            rows = datasets.load_dataset(name, spec.config, split=split, revision=sha, streaming=True)
            yield from rows
        except HubError:
            raise
        except Exception as exc:  # noqa: BLE001 (datasets raises ValueError, OSError, FileNotFoundError, ...)
            raise hub_error(exc, name) from None


@dataclass(frozen=True)
class HubDatasetView:
    """What the plan gate sees of one entry's dataset at its resolved commit."""

    commit: str
    config: str  # the config read (the default one when the entry names none)
    configs: list[str]
    splits: dict[str, int | None]  # every split of that config: rows (None where the card does not say)


def describe(spec: HubDataset, uri: str) -> HubDatasetView:
    """The entry's dataset as the Hub serves it: raises HubError for a missing config (listing the configs) or no
    access; the splits are not checked here (the caller names the missing ones)."""
    import datasets

    name, sha = dataset_id(uri), resolve_commit(uri, spec.revision)
    try:
        builder = datasets.load_dataset_builder(name, spec.config, revision=sha)
        configs = datasets.get_dataset_config_names(name, revision=sha)
    except Exception as exc:  # noqa: BLE001
        raise hub_error(exc, name) from None
    if builder.info.splits:
        splits = {str(k): v.num_examples for k, v in builder.info.splits.items()}
    else:
        splits = {str(k): None for k in builder.config.data_files or {}}
    return HubDatasetView(commit=sha, config=builder.config.name, configs=list(configs), splits=splits)
