"""Optional KubeRay RayCluster for the RolloutExecutor's Ray (`spec.rollout.rayCluster`).

Shaped like KubeRay's own samples (ray-cluster.sample.yaml): a head group exposing GCS
(6379), dashboard (8265) and Ray Client (10001) — the `<job>-rollout` Service selects this
head pod, so trainers keep using `ray://<job>-rollout:10001` — and one CPU worker group of
`workers` replicas, all running `spec.rollout.rayCluster.image` (use an image that carries
the rollout code and reward functions if Ray tasks are to run them on the workers). Validated against the real KubeRay CRD
(third_party/kuberay) in tests.
"""

from __future__ import annotations

from typing import Any

from rljob_operator import labels as L
from rljob_operator.kinds import RAY_API_VERSION, RAY_CLUSTER_KIND
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.podsecurity import restricted_container, restricted_pod
from rljob_operator.manifests.podspec import container_resources
from rljob_operator.manifests.rayauth import ray_auth_env
from rljob_operator.names import ray_cluster_name

ROLE_RAY = "ray"


def _container(
    name: str, image: str, resources: dict[str, Any], ports: list[dict[str, Any]], env: list[dict[str, Any]]
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": image, "env": env, "securityContext": restricted_container()}
    if resources:
        c["resources"] = resources
    if ports:
        c["ports"] = ports
    return c


def ray_cluster(job: dict[str, Any] | JobView) -> dict[str, Any] | None:
    """The RayCluster, or None when `spec.rollout.rayCluster` is not set."""
    view = JobView.of(job)
    rc = view.spec.rollout.ray_cluster
    if rc is None:
        return None
    resources = container_resources(view.spec.rollout.resources, 0)
    pod_labels = L.job_labels(view.name, ROLE_RAY)
    head_ports = [
        {"name": "gcs-server", "containerPort": 6379},
        {"name": "dashboard", "containerPort": 8265},
        {"name": "client", "containerPort": 10001},
    ]
    spec: dict[str, Any] = {
        "rayVersion": rc.ray_version,
        "headGroupSpec": {
            "rayStartParams": {"dashboard-host": "0.0.0.0"},
            "template": {
                "metadata": {"labels": dict(pod_labels)},
                "spec": {
                    "securityContext": restricted_pod(uid=None),
                    "containers": [
                        _container("ray-head", rc.image, resources, head_ports, ray_auth_env(view))
                    ],
                },
            },
        },
    }
    if rc.workers > 0:
        spec["workerGroupSpecs"] = [
            {
                "groupName": "cpu",
                "replicas": rc.workers,
                "minReplicas": rc.workers,
                "maxReplicas": rc.workers,
                "rayStartParams": {},
                "template": {
                    "metadata": {"labels": dict(pod_labels)},
                    "spec": {
                        "securityContext": restricted_pod(uid=None),
                        "containers": [
                            _container("ray-worker", rc.image, dict(resources), [], ray_auth_env(view))
                        ],
                    },
                },
            }
        ]
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": RAY_CLUSTER_KIND,
        "metadata": view.metadata(ray_cluster_name(view.name), ROLE_RAY),
        "spec": spec,
    }
