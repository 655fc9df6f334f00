"""The Kubernetes pod schemas the CRD embeds, vendored from the Kubernetes OpenAPI v3 document.

`spec.<role>.template.spec` is a real PodSpec and `env[].valueFrom` a real EnvVarSource, so
the API server validates them and `kubectl explain` shows them (as KubeRay's CRDs embed
PodTemplateSpec). A CRD cannot `$ref` another schema, so each use is a copy; to keep the CRD
small (a client-side `kubectl apply` stores the whole object in a 256 KiB annotation) the
vendored copy is pruned:

- descriptions dropped (the reference points at the Pod API instead);
- `ephemeralContainers` dropped (the API server refuses them on create anyway);
- the deprecated in-tree volume plugins, `affinity` and user containers' probes and
  `lifecycle` kept as objects the API server stores unchanged (`x-kubernetes-preserve-unknown-fields`):
  still passed to the pod, and validated by the API server when the pod is created;
- `containers` not required: the operator brings the main container.

Lists that a CEL rule walks get a `maxItems`, so the API server's cost estimate stays small.

Regenerate with `python -m rljob_operator.podschema --openapi <kubernetes>/api/openapi-spec/v3/api__v1_openapi.json`
from the Kubernetes version the test cluster runs (tests/cluster/versions.env); the Go module
cache of the test cluster's build holds it.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

Schema = dict[str, Any]

SCHEMA_PATH = Path(__file__).resolve().parent / "k8s_schemas" / "pod.json"
KUBE_VERSION = "v1.36.3"
PREFIX = "io.k8s.api.core.v1."
# The roots the CRD uses, by the name the pydantic models mark them with (`K8S_SCHEMA`).
ROOTS = {"PodSpec": PREFIX + "PodSpec", "EnvVarSource": PREFIX + "EnvVarSource"}

OPAQUE_VOLUME_SOURCES = {
    # deprecated or rare in-tree volume plugins (fields of a Volume only: a container's `image` is a string)
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "flexVolume", "flocker",
    "gcePersistentDisk", "gitRepo", "glusterfs", "photonPersistentDisk", "portworxVolume", "quobyte",
    "rbd", "scaleIO", "storageos", "vsphereVolume", "iscsi", "fc", "ephemeral", "csi", "image",
}
OPAQUE_PROPERTIES = {
    # large and rarely templated; validated by the API server on the pod itself
    "affinity", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "resourceClaims",
    "dnsConfig", "topologySpreadConstraints", "os", "schedulingGates", "resizePolicy", "restartPolicyRules",
}  # fmt: skip
DROPPED_PROPERTIES = {"ephemeralContainers"}
NOT_REQUIRED = {("PodSpec", "containers")}
MAX_ITEMS = {"containers": 64, "initContainers": 64, "volumes": 256, "env": 256, "ports": 64, "volumeMounts": 256}
KEPT_EXTENSIONS = {"x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type"}
INT_OR_STRING = {PREFIX.replace("api.core.v1.", "apimachinery.pkg.util.intstr.") + "IntOrString",
                 "io.k8s.apimachinery.pkg.api.resource.Quantity"}  # fmt: skip
TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _convert(node: Schema, defs: dict[str, Schema], owner: str, prop: str = "") -> Schema:
    if "allOf" in node and len(node["allOf"]) == 1 and "$ref" in node["allOf"][0]:
        merged = {k: v for k, v in node.items() if k != "allOf"}
        return _convert({**merged, "$ref": node["allOf"][0]["$ref"]}, defs, owner, prop)
    if "$ref" in node:
        target = _name(node["$ref"])
        if target in INT_OR_STRING:
            return {"x-kubernetes-int-or-string": True}
        if target == TIME:
            return {"type": "string", "format": "date-time"}
        siblings = {k: v for k, v in node.items() if k not in ("$ref", "description")}
        return _convert({**defs[target], **siblings}, defs, target.removeprefix(PREFIX), prop)
    out: Schema = {}
    if prop in OPAQUE_PROPERTIES or (owner == "Volume" and prop in OPAQUE_VOLUME_SOURCES):
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    for key, value in node.items():
        if key == "properties":
            out[key] = {
                name: _convert(sub, defs, owner, name)
                for name, sub in sorted(value.items())
                if name not in DROPPED_PROPERTIES
            }
        elif key == "items":
            out[key] = _convert(value, defs, owner)
        elif key == "additionalProperties":
            out[key] = _convert(value, defs, owner)
        elif key == "required":
            kept = sorted(r for r in value if (owner, r) not in NOT_REQUIRED)
            if kept:
                out[key] = kept
        elif key == "default":
            if value not in ({}, [], None):  # "" stays: a list-map key needs a default or `required`
                out[key] = value
        elif key in ("type", "format", "enum") or key in KEPT_EXTENSIONS:
            out[key] = value
    if out.get("type") == "array" and prop in MAX_ITEMS:
        out["maxItems"] = MAX_ITEMS[prop]
    if out.get("format") == "int-or-string":
        return {"x-kubernetes-int-or-string": True}
    return out


def prune(openapi: Schema) -> dict[str, Schema]:
    """{root name: structural schema} from a Kubernetes OpenAPI v3 document (`api/v1`)."""
    defs = openapi["components"]["schemas"]
    return {name: _convert(defs[full], defs, name) for name, full in ROOTS.items()}


def render(openapi: Schema) -> str:
    doc = {"kubernetesVersion": KUBE_VERSION, "schemas": prune(openapi)}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


@cache
def _vendored() -> dict[str, Schema]:
    return json.loads(SCHEMA_PATH.read_text())["schemas"]


def k8s_schema(name: str) -> Schema:
    """A fresh copy of a vendored schema by root name (PodSpec, EnvVarSource)."""
    return json.loads(json.dumps(_vendored()[name]))


def embedded_kind(node: Schema) -> str | None:
    """The root name when `node` is one of the vendored schemas as the CRD embeds it (its own description aside)."""
    body = {k: v for k, v in node.items() if k != "description"}
    return next((name for name, schema in _vendored().items() if schema == body), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rljob_operator.podschema", description=__doc__.splitlines()[0])
    parser.add_argument("--openapi", type=Path, required=True, help="Kubernetes api__v1_openapi.json (OpenAPI v3)")
    parser.add_argument("--output", type=Path, default=SCHEMA_PATH)
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render(json.loads(args.openapi.read_text())))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
