"""Evaluate the CRD's CEL rules on an RLJob without an API server (cel-python).

Tests use this to pin every rule's behaviour, and to check the examples, in milliseconds;
the integration tier runs the same tables against a real kube-apiserver. It mirrors what
the API server does before it evaluates a rule: defaults applied from the schema, unknown
fields pruned, values typed by the schema (a `number` field is a double even when written
as `30`, so a rule comparing it with an int literal fails here as it would there), and
transition rules (`oldSelf`) only on updates, for objects not inside a list.

Needs the `cel-python` package (the `test` extra); the operator itself never imports this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

from rljob_operator.structural import Schema, apply_defaults


@dataclass(frozen=True)
class RuleViolation:
    """One failed rule, reported as the API server reports it: `<field>: <message>`."""

    field: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def to_cel(value: Any, schema: Schema | None) -> Any:
    """A JSON value as a typed CEL value, following the schema's types."""
    if schema is None or (schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema):
        return celpy.json_to_cel(value)
    if value is None:
        return None
    kind = schema.get("type")
    if kind == "integer":
        return celtypes.IntType(value)
    if kind == "number":
        return celtypes.DoubleType(float(value))
    if kind == "string":
        return celtypes.StringType(value)
    if kind == "boolean":
        return celtypes.BoolType(value)
    if kind == "array":
        return celtypes.ListType([to_cel(v, schema.get("items")) for v in value])
    if kind == "object":
        props: dict[str, Schema] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if key not in props and sub is None:
                continue  # pruned by the API server
            out[celtypes.StringType(key)] = to_cel(item, sub)
        return celtypes.MapType(out)
    return celpy.json_to_cel(value)


_VERB = re.compile(r"%(?:\.(\d+))?(.?)", re.DOTALL)


def cel_format(template: Any, args: Any) -> celtypes.StringType:
    """Kubernetes' `'<template>'.format([args])` (CEL strings extension), the verbs our rules use.

    cel-python lacks the strings extension; %d, %s, %f, %.Nf and %% are implemented here as the
    Kubernetes library formats them. Any other verb is an error, so a rule that starts using
    one fails its tests instead of being checked wrongly.
    """
    values = list(args)

    def one(match: re.Match[str]) -> str:
        precision, verb = match.groups()
        if verb == "%":
            return "%"
        if verb not in ("d", "s", "f"):
            raise ValueError(f"format: unsupported verb %{verb} in {template!r}")
        if not values:
            raise ValueError(f"format: too few arguments for {template!r}")
        value = values.pop(0)
        if verb == "d":
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"format: %d needs an integer, got {value!r}")
            return str(int(value))
        if verb == "f":
            return f"{float(value):.{int(precision) if precision else 6}f}"
        return str(value)

    return celtypes.StringType(_VERB.sub(one, str(template)))


# Typed as celpy's own function table (its value type is a union of every CEL type).
FUNCTIONS: dict[str, Any] = {"format": cel_format}


@dataclass(frozen=True)
class _Compiled:
    rule: str
    message: str
    field_path: str
    program: Any
    message_program: Any | None
    transition: bool


class CelChecker:
    """Compiles every `x-kubernetes-validations` rule of a schema once; checks objects against them."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._env = celpy.Environment()
        self._compiled: dict[int, list[_Compiled]] = {}
        self._compile(schema)

    def _compile(self, node: Schema) -> None:
        rules = []
        for r in node.get("x-kubernetes-validations", []):
            message_expr = r.get("messageExpression")
            rules.append(
                _Compiled(
                    rule=r["rule"],
                    message=r.get("message", f"failed rule: {r['rule']}"),
                    field_path=r.get("fieldPath", ""),
                    program=self._env.program(self._env.compile(r["rule"]), functions=FUNCTIONS),
                    message_program=(
                        self._env.program(self._env.compile(message_expr), functions=FUNCTIONS) if message_expr else None
                    ),
                    transition="oldSelf" in r["rule"],
                )
            )
        if rules:
            self._compiled[id(node)] = rules
        for sub in node.get("properties", {}).values():
            self._compile(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                self._compile(node[key])

    @property
    def rules(self) -> list[str]:
        return [c.rule for rules in self._compiled.values() for c in rules]

    def violations(
        self, obj: dict[str, Any], old: dict[str, Any] | None = None, *, defaults: bool = True
    ) -> list[RuleViolation]:
        """All failed rules for a create (`old` None) or an update from `old`.

        `defaults=False` checks the object as written, as the API server checks a schema's
        `default` values when it admits the CRD.
        """
        new = apply_defaults(obj, self.schema) if defaults else obj
        previous = old if old is None or not defaults else apply_defaults(old, self.schema)
        out: list[RuleViolation] = []
        self._check(new, previous, self.schema, "", out, in_list=False)
        return out

    def _check(self, value: Any, old: Any, schema: Schema, path: str, out: list[RuleViolation], *, in_list: bool) -> None:
        if value is None:
            return
        for c in self._compiled.get(id(schema), []):
            if c.transition and (old is None or in_list):
                continue
            activation = {"self": to_cel(value, schema)}
            if c.transition:
                activation["oldSelf"] = to_cel(old, schema)
            field = (path + c.field_path).lstrip(".") or "<root>"
            try:
                ok = c.program.evaluate(activation)
            except celpy.CELEvalError as e:
                out.append(RuleViolation(field, c.rule, f"rule could not be evaluated: {e}"))
                continue
            if isinstance(ok, celpy.CELEvalError):
                out.append(RuleViolation(field, c.rule, f"rule could not be evaluated: {ok}"))
            elif not ok:
                out.append(RuleViolation(field, c.rule, self._message(c, activation)))
        kind = schema.get("type")
        if kind == "object" and isinstance(value, dict):
            for key, sub in schema.get("properties", {}).items():
                if key in value:
                    prev = old.get(key) if isinstance(old, dict) else None
                    self._check(value[key], prev, sub, f"{path}.{key}", out, in_list=in_list)
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                for key, item in value.items():
                    prev = old.get(key) if isinstance(old, dict) else None
                    self._check(item, prev, extra, f"{path}[{key}]", out, in_list=in_list)
        elif kind == "array" and isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                self._check(item, None, schema["items"], f"{path}[{i}]", out, in_list=True)

    @staticmethod
    def _message(c: _Compiled, activation: dict[str, Any]) -> str:
        if c.message_program is None:
            return c.message
        try:
            text = c.message_program.evaluate(activation)
        except celpy.CELEvalError:
            return c.message  # the API server falls back to `message` too
        return str(text) if isinstance(text, str) else c.message
