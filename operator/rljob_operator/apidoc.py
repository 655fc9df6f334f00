"""Generate docs/api-reference.md from the CRD schema (`python -m rljob_operator.apidoc [--check]`).

The reference is rendered from the same structural schema the API server enforces (built by
`rljob_operator.crdgen` from the pydantic models), so every type, default, bound and CEL
rule it lists is one the API server applies; a test fails when the file is stale.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rljob_operator import crdgen
from rljob_operator.generated import generator_main
from rljob_operator.kinds import GROUP, KIND, VERSION
from rljob_operator.podschema import embedded_kind
from rljob_operator.structural import Schema

DOC_PATH = crdgen.REPO_ROOT / "docs" / "api-reference.md"
REGENERATE = "python -m rljob_operator.apidoc"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _prose(text: str) -> str:
    """Descriptions and messages: `<job>` must not read as an HTML tag."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _code(value: Any) -> str:
    """A value as inline code: JSON, so that "" and "8" read differently from nothing and 8."""
    return _literal(json.dumps(value, separators=(", ", ": ")))


def _literal(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def type_name(node: Schema) -> str:
    """The type as a reader thinks of it: `[]string`, `map[string]string`, `object`..."""
    kind = node.get("type", "any")
    embedded = embedded_kind(node)
    if embedded is not None:
        return f"{embedded} (core/v1)"
    if kind == "array":
        return "[]" + type_name(node.get("items", {}))
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return "map[string]" + type_name(node["additionalProperties"])
    if kind == "object" and node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node:
        return "object (free-form)"
    return kind


def constraints(node: Schema) -> list[str]:
    out = []
    if "enum" in node:
        out.append("one of " + ", ".join(_code(v) for v in node["enum"]))
    if "minimum" in node:
        out.append(("> " if node.get("exclusiveMinimum") else "≥ ") + str(node["minimum"]))
    if "maximum" in node:
        out.append(("< " if node.get("exclusiveMaximum") else "≤ ") + str(node["maximum"]))
    if "minLength" in node:
        out.append(f"length ≥ {node['minLength']}")
    if "maxLength" in node:
        out.append(f"length ≤ {node['maxLength']}")
    if "pattern" in node:
        out.append(f"matches {_literal(node['pattern'])}")
    if "maxItems" in node:
        out.append(f"≤ {node['maxItems']} items")
    if "maxProperties" in node:
        out.append(f"≤ {node['maxProperties']} entries")
    items = node.get("items")
    if isinstance(items, dict) and "enum" in items:
        out.append("items one of " + ", ".join(_code(v) for v in items["enum"]))
    if node.get("nullable"):
        out.append("may be null")
    return out


def _anchor(path: str) -> str:
    return "".join(ch for ch in path.lower() if ch.isalnum() or ch in "-_")


def _is_section(node: Schema) -> bool:
    """An object with named fields of ours; an embedded Kubernetes type is documented by `kubectl explain`."""
    return node.get("type") == "object" and "properties" in node and embedded_kind(node) is None


def _sections(node: Schema, path: str) -> list[tuple[str, Schema]]:
    """Every object with named fields, depth first, in declaration order."""
    if embedded_kind(node) is not None:
        return []
    out = [(path, node)] if _is_section(node) else []
    for name, sub in node.get("properties", {}).items():
        out += _sections(sub, f"{path}.{name}")
    items = node.get("items")
    if isinstance(items, dict):
        out += _sections(items, f"{path}[]")
    return out


def _rules_table(rules: list[dict[str, Any]], path: str) -> list[str]:
    lines = ["| Rule (CEL) | Field | Message | Checked |", "|---|---|---|---|"]
    for r in rules:
        field = path + r.get("fieldPath", "")
        when = "on update" if "oldSelf" in r["rule"] else "always"
        message = r["message"]
        if "messageExpression" in r:
            message += " (the API server fills in the values)"
        lines.append(f"| {_cell(_literal(r['rule']))} | `{field}` | {_cell(_prose(message))} | {when} |")
    return lines


def _section(path: str, node: Schema) -> list[str]:
    lines = [f"### `{path}`", ""]
    if node.get("description"):
        lines += [_prose(node["description"]), ""]
    required = set(node.get("required", []))
    lines += ["| Field | Type | Default | Constraints | Description |", "|---|---|---|---|---|"]
    for name, sub in node["properties"].items():
        child = f"{path}.{name}"
        target = child if _is_section(sub) else (f"{child}[]" if _is_section(sub.get("items", {})) else None)
        label = f"[`{name}`](#{_anchor(target)})" if target else f"`{name}`"
        if name in required:
            label += " **(required)**"
        default = _code(sub["default"]) if "default" in sub else ""
        if _is_section(sub) and "default" in sub:
            default = "its fields' defaults"
        lines.append(
            f"| {label} | {_cell(type_name(sub))} | {_cell(default)} | {_cell('; '.join(constraints(sub)))} "
            f"| {_cell(_prose(sub.get('description', '')))} |"
        )
    if node.get("x-kubernetes-validations"):
        lines += ["", "Rules:", "", *_rules_table(node["x-kubernetes-validations"], path)]
    return [*lines, ""]


def render(schema: Schema | None = None) -> str:
    schema = schema or crdgen.open_api_schema()
    spec = schema["properties"]["spec"]
    status = schema["properties"]["status"]
    all_rules = [
        (path, rule)
        for path, node in _sections(spec, "spec")
        for rule in node.get("x-kubernetes-validations", [])
    ]
    lines = [
        f"# {KIND} API reference ({GROUP}/{VERSION})",
        "",
        f"<!-- Generated from controller_runtime/api by `{REGENERATE}`. Do not edit by hand. -->",
        "",
        f"An `{KIND}` (short name `rlj`) runs reinforcement-learning post-training of an LLM: a fleet of "
        "inference engine cells, a rollout executor that samples and scores, and trainers. `spec` is your "
        "intent; `status` is written by the operator alone. The same schema is enforced by the API server "
        "(`crds/rljob.yaml`) and by local mode (`rljob run`), with the same messages.",
        "",
        "Conventions:",
        "",
        "- Field names are camelCase on the wire. A block whose default is *its fields' defaults* is created "
        "for you when left out, so `kubectl get rlj NAME -o yaml` shows every effective setting.",
        "- Unknown fields are rejected by `kubectl apply` (server-side field validation, strict by default) "
        "and by local mode; only `affinity`, `rollout.reward.args` and parts of pod templates take free-form content.",
        "- A `null` is the same as leaving the field out, except where a field says *may be null*.",
        "",
        "## Pod templates",
        "",
        "`spec.inference.template`, `spec.rollout.template` and `spec.trainer.template` are Kubernetes "
        "PodTemplateSpecs (`kubectl explain rlj.spec.trainer.template.spec`) merged into the pods the operator "
        "builds: engine cell pods, the executor Deployment's pods and the trainer Job's pods. The main container "
        "is named `engine`, `executor` or `trainer`: a container of that name in the template adds to it, other "
        "containers are added as sidecars. Maps merge key by key (the template wins); env, volumes and "
        "imagePullSecrets merge by name, ports by containerPort, volumeMounts by mountPath (a matching entry is "
        "replaced whole); tolerations and envFrom are appended; `affinity` is replaced whole; any other field "
        "replaces the operator's default (e.g. a `dshm` volume with a `sizeLimit` replaces the operator's "
        "memory-backed `/dev/shm`). What the operator relies on (the main container's image, command, args, "
        "ports and probes, the GPU count, restartPolicy, hostname and subdomain, labels under rljob.io/, the init "
        "containers fetch-model and fetch-dataset) is "
        "refused at admission with a message naming the field; the schema keeps the Pod API's own fields, "
        "with probes, lifecycle, affinity and the rarer volume types stored as given and checked by the API "
        "server when the pod is created.",
        "",
        "`env`, `resources`, `placement` and `podMetadata` stay as shorthands: they are applied first and the "
        "template is merged over them. `env[].valueFrom` reads a Secret or ConfigMap (e.g. `HF_TOKEN`); "
        "`gpuResource` names the GPU extended resource (`nvidia.com/gpu` by default, `amd.com/gpu` for AMD). "
        "Local mode (`rljob run`) runs processes, not pods: it takes `valueFrom` values from `--env-file` and "
        "refuses templates, node selectors and affinity, saying what to remove.",
        "",
        "## Cross-field rules",
        "",
        "Checked by the API server (CEL `x-kubernetes-validations`) and mirrored in local mode. Rules "
        "checked *on update* compare with the stored object: those fields are immutable.",
        "",
        "| Rule (CEL) | Field | Message | Checked |",
        "|---|---|---|---|",
    ]
    for path, rule in all_rules:
        lines += _rules_table([rule], path)[2:]
    lines += ["", "## spec", ""]
    for path, node in _sections(spec, "spec"):
        lines += _section(path, node)
    lines += ["## status", ""]
    for path, node in _sections(status, "status"):
        lines += _section(path, node)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    return generator_main(argv, prog=REGENERATE, description=__doc__.splitlines()[0], default=DOC_PATH, render=render)


if __name__ == "__main__":
    sys.exit(main())
