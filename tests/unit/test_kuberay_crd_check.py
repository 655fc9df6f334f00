"""The compatibility check KubeRayProcess makes before reusing the cluster's RayCluster CRD
(tests/cluster/kuberay.py): a CRD that lacks a field of KubeRay's own would have the API server
prune what that KubeRay writes, silently."""

from __future__ import annotations

from typing import Any

from tests.cluster.kuberay import missing_fields


def crd(status: dict[str, Any], spec: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"spec": spec or {"type": "object"}, "status": status}}
    return {"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": schema}}]}}


STATUS = {
    "type": "object",
    "properties": {
        "state": {"type": "string"},
        "conditions": {
            "type": "array",
            "items": {"type": "object", "properties": {"type": {"type": "string"}}},
        },
        "endpoints": {
            "type": "object",
            "additionalProperties": {"type": "object", "properties": {"port": {"type": "integer"}}},
        },
    },
}


def test_a_superset_is_compatible() -> None:
    newer = crd(
        {**STATUS, "properties": {**STATUS["properties"], "readyWorkerReplicas": {"type": "integer"}}}
    )
    assert missing_fields(newer, crd(STATUS)) == []


def test_missing_nested_fields_are_named_by_path() -> None:
    older = crd({"type": "object", "properties": {"state": {"type": "string"},
                                                   "conditions": {"type": "array", "items": {"type": "object"}},
                                                   "endpoints": {"type": "object"}}})  # fmt: skip
    assert missing_fields(older, crd(STATUS)) == [".status.conditions[].type", ".status.endpoints{}.port"]
