"""Overrides: `--set path.to.key=value` (CLI) or a dict of dotted paths (KFP pipeline parameters) applied to a
config's plain data before it is validated."""

from __future__ import annotations

from typing import Any

import yaml

from flashdraft.config.errors import ConfigError

# Facts about target.model, written in presets so `plan` works without the model's files: when an override names
# another model they describe the old one, so the ones the override does not set itself are dropped (the plan then
# reads the new model's config, or says which figures it had to assume). drafter.* are settings, not facts: a
# drafter.hidden_size that contradicts the new target is refused instead.
TARGET_FACTS = ("target.num_layers", "target.hidden_size", "target.vocab_size", "target.params",
                "target.active_params", "plan.target_params", "plan.target_vocab", "plan.target_kv_bytes_per_token",
                "plan.target_state_bytes_per_sequence", "plan.target_intermediate_size")


def drop_stale_target_facts(data: dict[str, Any], model_before: Any, overrides: dict[str, Any] | list[str]) -> None:
    """Unset the TARGET_FACTS the overrides leave over from a model they replaced (in place)."""
    if not isinstance(data.get("target"), dict) or data["target"].get("model") == model_before:
        return
    keys = set(overrides) if isinstance(overrides, dict) else {parse_override(o)[0] for o in overrides}
    for fact in TARGET_FACTS:
        section, name = fact.split(".")
        if fact not in keys and isinstance(data.get(section), dict):
            data[section].pop(name, None)


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b.c=value` -> ("a.b.c", value); the value is parsed as YAML (numbers, lists, booleans, null)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like path.to.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {exc}") from exc
    return key, value


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any] | list[str]) -> dict[str, Any]:
    """Apply dotted-path overrides in place. Unknown sections surface as validation errors later."""
    items = [parse_override(o) for o in overrides] if isinstance(overrides, list) else list(overrides.items())
    for key, value in items:
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                if node.get(part) is not None:
                    raise ConfigError(f"override {key}: {part!r} is not a section")
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return data
