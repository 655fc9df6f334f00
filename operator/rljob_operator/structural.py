"""Operations on structural OpenAPI v3 schemas, the kind a CustomResourceDefinition carries.

The API server defaults an object from its schema before it validates it, and a CEL rule
sees the defaulted object. The generator (to pick which defaults to emit), the offline CEL
checker and the reference docs all need the same picture of that, so it lives here, as
pure functions over plain dicts.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

Schema = dict[str, Any]


def apply_defaults(value: Any, schema: Schema) -> Any:
    """Return `value` defaulted as the API server does it: top-down, nested defaults after the parent's.

    Nulls of non-nullable fields are dropped first (the API server prunes them before
    defaulting), so `field: null` means "unset" unless the schema says `nullable: true`.
    """
    if isinstance(value, dict) and schema.get("type") == "object":
        out: dict[str, Any] = {}
        props: dict[str, Schema] = schema.get("properties", {})
        for key, item in value.items():
            sub = props.get(key) or schema.get("additionalProperties")
            if item is None and not (isinstance(sub, dict) and sub.get("nullable")) and sub is not None:
                continue
            out[key] = apply_defaults(item, sub) if isinstance(sub, dict) else item
        for key, sub in props.items():
            if key not in out and "default" in sub:
                out[key] = apply_defaults(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(value, list) and schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def walk(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every node of a schema with its path: `.a.b` for properties, `[]` for items, `{}` for map values."""
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def is_empty(value: Any) -> bool:
    """True for None and for containers holding nothing but empty values."""
    if value is None:
        return True
    if isinstance(value, dict):
        return all(is_empty(v) for v in value.values())
    if isinstance(value, list):
        return not value
    return False


def strip_empty(value: Any) -> Any:
    """Drop None and empty containers from a nested value (what `to_wire` leaves out, and more)."""
    if isinstance(value, dict):
        out = {k: strip_empty(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if not is_empty(v)}
    return value


def pruned_paths(value: Any, schema: Schema, path: str = "") -> list[str]:
    """Paths in `value` the API server would drop as unknown fields (empty: nothing is lost).

    The operator writes status through the status subresource, where unknown fields are
    pruned silently; this tells a test that every field the models write has a home.
    """
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return []
    out: list[str] = []
    if isinstance(value, dict) and schema.get("type") == "object":
        props: dict[str, Schema] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is None:
                out.append(f"{path}.{key}")
            else:
                out += pruned_paths(item, sub, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += pruned_paths(item, schema["items"], f"{path}[{i}]")
    return out
