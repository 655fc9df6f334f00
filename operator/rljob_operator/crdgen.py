"""Generate `crds/rljob.yaml` from the pydantic models (`python -m rljob_operator.crdgen [--check]`).

The models in `controller_runtime.api` are the one source of truth; this turns their JSON
schema into a *structural* OpenAPI v3 schema as the API server requires it:

- every `$ref` inlined, `title`s dropped, `anyOf [X, null]` folded into X;
- `nullable: true` only where null means something (an optional field whose default is not
  null, e.g. `labelField: null` = no label); elsewhere the API server prunes a null, which
  is what pydantic does with None (the field is unset);
- no `additionalProperties: false`: the API server prunes unknown fields, and kubectl's
  server-side field validation (`--validate=strict`, kubectl's default) turns them into
  errors; `dict[str, Any]` becomes `x-kubernetes-preserve-unknown-fields`;
- JSON Schema 2020 `exclusiveMinimum: n` becomes OpenAPI 3.0 `minimum: n, exclusiveMinimum: true`;
- defaults kept for `spec` (default factories too: a nested model's default is its fields'
  defaults written out, so a stored RLJob shows every effective setting and the CEL rules
  see them); dropped for `status`, which the operator always writes whole;
- CEL rules (`x-kubernetes-validations`) and descriptions kept;
- a field marked with a Kubernetes type (`K8S_SCHEMA`: PodSpec, EnvVarSource) carries that
  type's vendored schema (`rljob_operator.podschema`).

Output is byte-stable: keys in a fixed order, properties in declaration order.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

from controller_runtime.api import RLJobSpec, RLJobStatus
from controller_runtime.api.podtemplate import K8S_SCHEMA
from rljob_operator.generated import generator_main
from rljob_operator.kinds import API_VERSION, GROUP, KIND, LIST_KIND, PLURAL, VERSION
from rljob_operator.podschema import k8s_schema
from rljob_operator.structural import Schema, strip_empty

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = REPO_ROOT / "crds" / "rljob.yaml"
REGENERATE = "python -m rljob_operator.crdgen"

SINGULAR = "rljob"
SHORT_NAMES = ["rlj"]
CATEGORIES = ["rljob"]

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase of the job."},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready", "description": "Serving engine cells / desired cells."},
    {"name": "Weights", "type": "string", "jsonPath": ".status.weightVersion", "description": "Weight version the serving engines hold."},
    {"name": "Rollout", "type": "integer", "jsonPath": ".status.rolloutId", "description": "Last rollout handed to the trainers."},
    {"name": "Queue", "type": "string", "jsonPath": ".status.queue.state", "description": "Kueue: Pending, Admitted, Evicted or Finished."},
    {"name": "Pass@1", "type": "number", "jsonPath": ".status.lastEval.passAt1", "description": "pass@1 of the last evaluation of the policy."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# The order keys are written in; anything not listed follows, sorted.
KEY_ORDER = [
    "description", "type", "format", "enum", "default", "nullable",
    "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum",
    "minLength", "maxLength", "pattern", "minItems", "maxItems", "minProperties", "maxProperties",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "required", "properties", "items", "additionalProperties", "x-kubernetes-validations",
]
RULE_KEY_ORDER = ["rule", "message", "messageExpression", "fieldPath", "reason", "optionalOldSelf"]
DROPPED_KEYS = {"title", "$defs", "examples"}


class _WithFactoryDefaults(GenerateJsonSchema):
    """Emit `default_factory` results as defaults (pydantic leaves them out)."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return cast(Callable[[], Any], factory)()  # takes no data: checked just above
        return schema.get("default", NoDefault)


class UnsupportedSchema(ValueError):
    """A model uses a construct a structural schema cannot express; fix the model."""


def structural_schema(model: type[BaseModel], *, keep_defaults: bool) -> Schema:
    """The structural openAPIV3Schema of a pydantic model (validation mode, camelCase)."""
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_WithFactoryDefaults)
    defs = raw.get("$defs", {})
    return _convert(raw, defs, keep_defaults=keep_defaults, path=model.__name__)


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inline a `$ref`; sibling keys (description, default) win over the definition's."""
    if "$ref" not in node:
        return node
    name = node["$ref"].removeprefix("#/$defs/")
    merged = dict(_resolve(defs[name], defs))
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged


def _fold_any_of(node: Schema, defs: dict[str, Schema], path: str) -> tuple[Schema, bool]:
    """`anyOf [X, null]` -> (X merged with the siblings, True). Anything richer is refused."""
    variants = [_resolve(v, defs) for v in node["anyOf"]]
    non_null = [v for v in variants if v.get("type") != "null"]
    if len(non_null) != 1:
        raise UnsupportedSchema(f"{path}: anyOf with {len(non_null)} non-null variants cannot be structural")
    siblings = {k: v for k, v in node.items() if k != "anyOf"}
    merged = dict(non_null[0])
    merged.update(siblings)
    if merged.get("type") == "object" and merged.get("additionalProperties") is True:
        merged.pop("additionalProperties")
    return merged, len(non_null) != len(variants)


def _convert(node: Schema, defs: dict[str, Schema], *, keep_defaults: bool, path: str) -> Schema:
    node = _resolve(node, defs)
    had_null = False
    if "anyOf" in node:
        node, had_null = _fold_any_of(node, defs, path)
        node = _resolve(node, defs)
    if K8S_SCHEMA in node:  # a Kubernetes type: its vendored structural schema (rljob_operator.podschema)
        embedded = k8s_schema(node[K8S_SCHEMA])
        if "description" in node:
            embedded["description"] = node["description"]
        return _ordered(embedded)
    for forbidden in ("oneOf", "allOf", "not"):
        if forbidden in node:
            raise UnsupportedSchema(f"{path}: {forbidden} is not supported in the CRD schema")

    out: Schema = {}
    for key, value in node.items():
        if key in DROPPED_KEYS or key == "$ref":
            continue
        if key == "properties":
            out[key] = {
                name: _convert(sub, defs, keep_defaults=keep_defaults, path=f"{path}.{name}")
                for name, sub in value.items()
            }
        elif key == "items":
            out[key] = _convert(value, defs, keep_defaults=keep_defaults, path=f"{path}[]")
        elif key == "additionalProperties":
            if value is False:
                continue  # unknown fields are pruned by the API server, rejected by strict field validation
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
                continue
            out[key] = _convert(value, defs, keep_defaults=keep_defaults, path=f"{path}{{}}")
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value

    if "enum" in out and "type" not in out:
        types = {type(v) for v in out["enum"]}
        if types == {str}:
            out["type"] = "string"
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
        out["type"] = "object"

    default = out.pop("default", None)
    if keep_defaults and default is not None:
        default = _default_worth_emitting(default, out)
        if default is not None:
            out["default"] = default
    if had_null and keep_defaults and "default" in out:
        out["nullable"] = True  # null is a choice here, not "unset": keep it from being pruned and defaulted
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        raise UnsupportedSchema(f"{path}: no type (a structural schema needs one on every node)")
    return _ordered(out)


def _default_worth_emitting(default: Any, schema: Schema) -> Any:
    """The default to write, or None when writing it would only add noise.

    Empty lists and maps are left out (absent and empty mean the same to every reader). A
    nested model's default is written out whole, not as `{}`: the API server checks a
    default against the CEL rules of its object without filling in nested defaults first
    (`default: {}` on an object with a rule fails with "no such key").
    """
    if isinstance(default, list):
        return default or None
    if isinstance(default, dict) and "properties" in schema:
        return strip_empty(default) or None
    if isinstance(default, dict):
        return default or None
    return default


def _ordered(node: Schema) -> Schema:
    rank = {k: i for i, k in enumerate(KEY_ORDER)}
    keys = sorted(node, key=lambda k: (rank.get(k, len(rank)), k))
    out = {k: node[k] for k in keys}
    if "x-kubernetes-validations" in out:
        rule_rank = {k: i for i, k in enumerate(RULE_KEY_ORDER)}
        out["x-kubernetes-validations"] = [
            {k: r[k] for k in sorted(r, key=lambda k: (rule_rank.get(k, len(rule_rank)), k))}
            for r in out["x-kubernetes-validations"]
        ]
    return out


def open_api_schema() -> Schema:
    """The whole RLJob object's openAPIV3Schema."""
    spec = structural_schema(RLJobSpec, keep_defaults=True)
    status = structural_schema(RLJobStatus, keep_defaults=False)
    spec["description"] = "The user's intent. See docs/api-reference.md."
    status["description"] = "What the operator observed and did; written by the operator alone."
    # kopf keeps its handler progress in status.kopf; without this the API server would prune it
    # and kopf would warn on every patch. Not part of the RLJob API.
    status["properties"]["kopf"] = {
        "description": "Handler progress of the operator framework (kopf); not part of the API.",
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    return _ordered({
        "description": "RLJob runs reinforcement-learning post-training of an LLM: an inference engine fleet, "
        "a rollout executor and trainers.",
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"APIVersion of this object: {API_VERSION}."},
            "kind": {"type": "string", "description": f"Kind of this object: {KIND}."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    })


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "rljob-operator", "app.kubernetes.io/part-of": "rljob-operator"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": LIST_KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block style, long strings kept on one line, lists indented under their key, no anchors."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(crd: dict[str, Any]) -> str:
    header = f"# Generated from controller_runtime/api by `{REGENERATE}`. Do not edit by hand.\n"
    body = yaml.dump(crd, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1_000_000, allow_unicode=True)
    return header + body


def main(argv: list[str] | None = None) -> int:
    return generator_main(argv, prog=REGENERATE, description=__doc__.splitlines()[0], default=CRD_PATH, render=lambda: render(build_crd()))


if __name__ == "__main__":
    sys.exit(main())
