"""Optional KubeRay RayCluster for the RolloutExecutor's Ray (`spec.rollout.rayCluster`).

Shaped like KubeRay's own samples (ray-cluster.sample.yaml): a head group exposing GCS
(6379), dashboard (8265) and Ray Client (10001) — the `<job>-rollout` Service selects this
head pod, so trainers keep using `ray://<job>-rollout:10001` — and one CPU worker group of
`workers` replicas, all running `spec.rollout.rayCluster.image` (use an image that carries
the rollout code and reward functions if Ray tasks are to run them on the workers). Validated against the real KubeRay CRD
(third_party/kuberay) in tests, and reconciled by the real KubeRay operator v1.5.0 in
tests/e2e/test_kuberay_rollout.py.

Two choices the real KubeRay made visible:
- the head and worker pods carry `spec.rollout.podMetadata`: with a RayCluster the executor's
  actor (the rollout itself) runs in the head pod, so labels and annotations meant for the
  rollout's pods (sidecar opt-outs, cost labels, the test cluster's process label) must reach it;
- the pods run as the executor's ServiceAccount (the trainer's unless set otherwise), token
  mounted: the actor reads the pod's token to call the controller API (engine discovery), so
  in the head pod it must be the token the executor pod has, not the namespace's `default`;
- `disable-usage-stats` in both groups' rayStartParams: KubeRay generates `ray start` from
  them, and Ray otherwise reports usage to an outside server by default; the executor's own
  head and the engines' Ray heads pass the same flag.
"""

from __future__ import annotations

import copy
from typing import Any

from rljob_operator import labels as L
from rljob_operator.kinds import RAY_API_VERSION, RAY_CLUSTER_KIND
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.podsecurity import restricted_container, restricted_pod
from rljob_operator.manifests.podspec import container_resources
from rljob_operator.manifests.rayauth import ray_auth_env
from rljob_operator.names import ray_cluster_name

ROLE_RAY = "ray"
NO_USAGE_STATS = {"disable-usage-stats": "true"}  # KubeRay turns "true" into a bare `--disable-usage-stats`


def _container(
    name: str, image: str, resources: dict[str, Any], ports: list[dict[str, Any]], env: list[dict[str, Any]]
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": image, "env": env, "securityContext": restricted_container()}
    if resources:
        c["resources"] = resources
    if ports:
        c["ports"] = ports
    return c


def _pod_spec(view: JobView, container: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "automountServiceAccountToken": True,
        "securityContext": restricted_pod(uid=None),
        "containers": [container],
    }
    if view.spec.trainer.service_account_name:  # as executor_deployment's default
        spec["serviceAccountName"] = view.spec.trainer.service_account_name
    return spec


def ray_cluster(job: dict[str, Any] | JobView) -> dict[str, Any] | None:
    """The RayCluster, or None when `spec.rollout.rayCluster` is not set (or there is no executor)."""
    view = JobView.of(job)
    rollout = view.spec.rollout
    if rollout is None or rollout.ray_cluster is None:
        return None
    rc = rollout.ray_cluster
    resources = container_resources(rollout.resources, 0)
    meta = rollout.pod_metadata
    pod_meta: dict[str, Any] = {"labels": {**meta.labels, **L.job_labels(view.name, ROLE_RAY)}}
    if meta.annotations:
        pod_meta["annotations"] = dict(meta.annotations)
    head_ports = [
        {"name": "gcs-server", "containerPort": 6379},
        {"name": "dashboard", "containerPort": 8265},
        {"name": "client", "containerPort": 10001},
    ]
    spec: dict[str, Any] = {
        # KubeRay deletes the cluster's pods while suspended (RayCluster spec.suspend), as the
        # engines and the executor stop: a suspended or preempted job holds no Ray pod either.
        "suspend": view.spec.suspend,
        "rayVersion": rc.ray_version,
        "headGroupSpec": {
            "rayStartParams": {"dashboard-host": "0.0.0.0", **NO_USAGE_STATS},
            "template": {
                "metadata": copy.deepcopy(pod_meta),
                "spec": _pod_spec(
                    view, _container("ray-head", rc.image, resources, head_ports, ray_auth_env(view))
                ),
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
                "rayStartParams": dict(NO_USAGE_STATS),
                "template": {
                    "metadata": copy.deepcopy(pod_meta),
                    "spec": _pod_spec(
                        view, _container("ray-worker", rc.image, dict(resources), [], ray_auth_env(view))
                    ),
                },
            }
        ]
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": RAY_CLUSTER_KIND,
        "metadata": view.metadata(ray_cluster_name(view.name), ROLE_RAY),
        "spec": spec,
    }
