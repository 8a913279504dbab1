"""Loading a run config: a packaged preset, then a YAML file merged over it section by section, then overrides;
the result is validated once."""

from __future__ import annotations

import copy
import difflib
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from flashdraft.config.errors import ConfigError
from flashdraft.config.overrides import apply_overrides, drop_stale_target_facts
from flashdraft.config.run import RunConfig, validate_config


def preset_names() -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in resources.files("flashdraft.config.presets").iterdir()
                  if p.name.endswith(".yaml"))


def _preset_dict(name: str) -> dict[str, Any]:
    path = resources.files("flashdraft.config.presets").joinpath(f"{name}.yaml")
    if not path.is_file():
        close = difflib.get_close_matches(name, preset_names(), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint}; available: {', '.join(preset_names())}")
    return yaml.safe_load(path.read_text()) or {}


def load_config(
    config: str | Path | None = None,
    preset: str | None = None,
    overrides: dict[str, Any] | list[str] | None = None,
) -> RunConfig:
    """Preset (optional) <- YAML file (optional, deep-merged) <- overrides; then validate."""
    data: dict[str, Any] = _preset_dict(preset) if preset else {}
    if config:
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: invalid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping")
        data = _merge_sections(RunConfig, data, loaded)
    if not data:
        raise ConfigError("no configuration: pass --preset NAME or --config FILE")
    if overrides:
        model = data.get("target", {}).get("model") if isinstance(data.get("target"), dict) else None
        apply_overrides(data, overrides)
        drop_stale_target_facts(data, model, overrides)
    return validate_config(data, source=str(config or f"preset {preset}"))


def _merge_sections(model: type[BaseModel], base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Merge a config file over a preset section by section; a value that is itself a mapping (a node selector,
    GPU overrides) is replaced whole, so a file can remove labels a preset set."""
    out = copy.deepcopy(base)
    for k, v in top.items():
        field = model.model_fields.get(k)
        sub = field.annotation if field is not None else None
        is_section = isinstance(sub, type) and issubclass(sub, BaseModel)
        if is_section and isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge_sections(sub, out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
