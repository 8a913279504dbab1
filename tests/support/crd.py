"""Validate a custom resource against its CustomResourceDefinition offline, as the API server would on create/update.

Two parts, each by a maintained library: the version's `openAPIV3Schema` by `jsonschema`, after translating the
Kubernetes structural-schema extensions it uses (`x-kubernetes-int-or-string`, `x-kubernetes-preserve-unknown-fields`,
`nullable`, `x-kubernetes-embedded-resource`, and strict field validation: an unknown field is an error, not pruned),
and every `x-kubernetes-validations` rule by a CEL interpreter (PyPI `common-expression-language`), with `self` bound
to the value at the rule's node and `oldSelf` to the old object's value there. As on the API server, a transition
rule (one that reads `oldSelf`) is evaluated only on an update where the old object has the value too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cel
import jsonschema
import yaml

_ABSENT = object()


@dataclass(frozen=True)
class Rule:
    """One `x-kubernetes-validations` entry and the schema path (`spec.trainer.numProcPerNode`, `[]` for an array
    item, `{}` for a map value) it sits on."""

    path: str
    rule: str
    message: str

    @property
    def transition(self) -> bool:
        return "oldSelf" in cel.compile(self.rule).variables()


def _structural(node: dict[str, Any], *, root: bool = False) -> dict[str, Any]:
    """The JSON Schema the API server's structural schema amounts to, for the fields it checks."""
    out: dict[str, Any] = {k: v for k, v in node.items()
                           if k in ("type", "enum", "pattern", "format", "minimum", "maximum", "minLength",
                                    "maxLength", "minItems", "maxItems", "required", "minProperties",
                                    "maxProperties", "exclusiveMinimum", "exclusiveMaximum", "uniqueItems")}
    for key in ("anyOf", "allOf", "oneOf"):  # value validations only, in a structural schema
        if key in node:
            out[key] = [_structural(sub) for sub in node[key]]
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in node:
        out["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = _structural(node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _structural(node["additionalProperties"])
    elif node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields") \
            and node.get("additionalProperties") is not True:
        # Strict field validation: a field the schema does not declare is refused (the server would prune it).
        out["additionalProperties"] = False
    if node.get("x-kubernetes-embedded-resource") or root:
        # apiVersion, kind and metadata of an object are validated by the API server itself, not the CRD schema.
        props = out.setdefault("properties", {})
        for key in ("apiVersion", "kind"):
            props.setdefault(key, {"type": "string"})
        props["metadata"] = {"type": "object"}
    return out


class CrdValidator:
    """One version of a CRD (default: the storage version) as an offline admission check."""

    def __init__(self, crd_file: Path, version: str | None = None):
        docs = [d for d in yaml.safe_load_all(crd_file.read_text()) if d]
        (crd,) = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
        versions = crd["spec"]["versions"]
        chosen = next(v for v in versions if (v["name"] == version if version else v.get("storage")))
        self.group, self.kind, self.version = crd["spec"]["group"], crd["spec"]["names"]["kind"], chosen["name"]
        self.schema = chosen["schema"]["openAPIV3Schema"]
        self._validator = jsonschema.Draft7Validator(_structural(self.schema, root=True))
        self.rules = list(self._rules(self.schema, ""))

    def _rules(self, node: dict[str, Any], path: str) -> Iterator[Rule]:
        for entry in node.get("x-kubernetes-validations", []):
            yield Rule(path, entry["rule"], entry.get("message", entry["rule"]))
        for key, sub in node.get("properties", {}).items():
            yield from self._rules(sub, f"{path}.{key}" if path else key)
        if "items" in node:
            yield from self._rules(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from self._rules(node["additionalProperties"], f"{path}{{}}")

    def schema_errors(self, obj: dict[str, Any]) -> list[str]:
        """`<field path>: <jsonschema message>` for every violation of the openAPIV3Schema."""
        errors = []
        if (obj.get("apiVersion"), obj.get("kind")) != (f"{self.group}/{self.version}", self.kind):
            errors.append(f"<root>: {obj.get('apiVersion')}/{obj.get('kind')} is not this CRD's "
                          f"{self.group}/{self.version}/{self.kind}")
        for err in sorted(self._validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
            errors.append(f"{'.'.join(map(str, err.absolute_path)) or '<root>'}: {err.message}")
        return errors

    def rule_errors(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
        """`<field path>: <rule's message> (rule)` for every x-kubernetes-validations rule that does not hold."""
        errors = []
        for rule in self.rules:
            program = cel.compile(rule.rule)
            for where, value, old_value in _values_at(obj, old, rule.path):
                if rule.transition and old_value is _ABSENT:
                    continue  # a transition rule applies to updates of an existing value only
                context = {"self": value} | ({"oldSelf": old_value} if rule.transition else {})
                if program.execute(context) is not True:
                    errors.append(f"{where or '<root>'}: {rule.message} ({rule.rule})")
        return errors

    def errors(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
        """Everything the API server would refuse `obj` for (as a create, or an update of `old`): schema first,
        then the rules (the server evaluates rules only on a schema-valid object)."""
        return self.schema_errors(obj) or self.rule_errors(obj, old)


def _values_at(obj: Any, old: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(concrete path, value, old value or _ABSENT) for every value the schema path `path` reaches in `obj`.
    Array items are matched to the old object's by index, which is what the server does for atomic lists."""
    steps = [s for s in path.replace("[]", ".[]").replace("{}", ".{}").split(".") if s]

    def walk(node: Any, old_node: Any, where: str, rest: list[str]) -> Iterator[tuple[str, Any, Any]]:
        if not rest:
            yield where, node, old_node
            return
        step, tail = rest[0], rest[1:]
        if step == "[]" and isinstance(node, list):
            for i, item in enumerate(node):
                prev = old_node[i] if isinstance(old_node, list) and i < len(old_node) else _ABSENT
                yield from walk(item, prev, f"{where}[{i}]", tail)
        elif step == "{}" and isinstance(node, dict):
            for key, item in node.items():
                prev = old_node.get(key, _ABSENT) if isinstance(old_node, dict) else _ABSENT
                yield from walk(item, prev, f"{where}.{key}", tail)
        elif isinstance(node, dict) and step in node:
            prev = old_node.get(step, _ABSENT) if isinstance(old_node, dict) else _ABSENT
            yield from walk(node[step], prev, f"{where}.{step}" if where else step, tail)

    yield from walk(obj, old if old is not None else _ABSENT, "", steps)
