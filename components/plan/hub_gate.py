"""The plan gate's look at every Hub dataset the run reads (`hf:` entries of data.sources and eval.suites), on the
CPU pool before any GPU task: each is opened at the commit its revision resolves to, as prep and evaluate will
open it (flashdraft/storage/hub_datasets.py: HF_ENDPOINT, HF_TOKEN from the pod's environment), and refused in
one line when access is denied, the revision or the config is missing or a split is not in the config, naming the
configs or splits that exist. What it saw (commit, config, rows per split where the card says) goes into the plan.
`plan.check_sources: false` skips it (docs/configuration.md).
"""

from __future__ import annotations

import functools
from typing import Any

from flashdraft.config import RunConfig
from flashdraft.config.target import HubDataset
from flashdraft.run import registry
from flashdraft.storage import hub_datasets as hub


def hub_entries(cfg: RunConfig) -> list[tuple[str, HubDataset, str]]:
    """(where in the config, entry, URI) of every hf: dataset this run reads: the sources when it runs prep, and
    the eval suites."""
    out: list[tuple[str, HubDataset, str]] = []
    if not registry.current().get("prep").skipped_for(cfg):
        out += [(f"data.sources[{i}]", s, s.uri) for i, s in enumerate(cfg.data.sources) if s.uri.startswith("hf:")]
    out += [(f"eval.suites[{i}] ({s.label})", s, s.source) for i, s in enumerate(cfg.eval.suites)
            if s.source.startswith("hf:")]
    return out


@functools.lru_cache(maxsize=64)
def _view(uri: str, config: str | None, revision: str | None) -> hub.HubDatasetView:
    """One look per dataset, config and revision (the preset reads gsm8k twice: thinking off and on)."""
    return hub.describe(HubDataset(split="", config=config, revision=revision), uri)


def check_entry(where: str, spec: HubDataset, uri: str) -> tuple[dict[str, Any], str | None]:
    """(what the plan records of it, the refusal line or None)."""
    seen: dict[str, Any] = {"entry": where, "uri": uri, "config": spec.config, "splits": spec.split_names,
                            "revision": spec.revision}
    try:
        view = _view(uri, spec.config, spec.revision)
    except hub.HubUnreachable:
        raise
    except hub.HubError as exc:
        return seen, f"{where} {uri}: {exc}"
    seen.update(commit=view.commit, config=view.config, rows={s: view.splits.get(s) for s in spec.split_names})
    missing = [s for s in spec.split_names if s not in view.splits]
    if missing:
        return seen, (f"{where} {uri}: no split {', '.join(missing)} in config {view.config}; it has "
                      f"{', '.join(view.splits)}" + (f" (configs: {', '.join(view.configs)})"
                                                     if len(view.configs) > 1 else ""))
    return seen, None


def hub_gate(cfg: RunConfig) -> tuple[list[dict[str, Any]], str | None]:
    """(every hf: entry as the Hub serves it, why the run may not start or None)."""
    if not cfg.plan.check_sources:
        return [], None
    checks = []
    entries = hub_entries(cfg)
    for n, entry in enumerate(entries):
        try:
            checks.append(check_entry(*entry))
        except hub.HubUnreachable as exc:  # one line for all: the endpoint, not the entries, is what to fix
            rest = f" (and {len(entries) - n - 1} more hf: entries unchecked)" if n + 1 < len(entries) else ""
            return [seen for seen, _ in checks], f"{entry[0]} {entry[2]}: {exc}{rest}"
    refusals = [line for _, line in checks if line]
    return [seen for seen, _ in checks], " | ".join(refusals) or None
