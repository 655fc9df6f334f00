"""The RolloutExecutor: a one-replica Deployment and the `<job>-rollout` Service.

The executor pod runs a Ray head whose Ray Client server (port 10001) the trainers connect
to as `ray://<job>-rollout:10001`, and a named detached actor per job. One replica with
strategy Recreate: two executors of one job would race for the same actor name and both
hand out batches, so the old pod must be gone before the new one starts (a rolling update
would briefly run both).

With `spec.rollout.rayCluster` the Ray head lives in a KubeRay RayCluster instead: the
executor connects to it as a Ray Client driver and the `<job>-rollout` Service selects the
RayCluster's head pod, so trainers use the same address either way.

The executor reads the RLJob itself (hence the automounted ServiceAccount token) and gets
the addresses it cannot derive on the command line and, redundantly, as environment.
It saves its dataset position under `<sharedPath>/<job>/executor` (`executor_state_dir`), so a
replaced executor pod resumes where the last one stopped.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from controller_runtime.api.podtemplate import EXECUTOR_CONTAINER
from controller_runtime.api.spec import WeightUpdateMethod
from rljob_operator import labels as L
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.podsecurity import restricted_container, restricted_pod
from rljob_operator.manifests.podspec import (
    checkpoints_volume,
    container_resources,
    dataset_fetch_containers,
    dataset_path,
    dataset_volume,
    env_field,
    env_value,
    model_fetch_containers,
    model_path,
    model_volume,
    volumes,
)
from rljob_operator.manifests.rayauth import ray_auth_env
from rljob_operator.manifests.services import engines_url
from rljob_operator.manifests.template import apply_template
from rljob_operator.names import ray_cluster_name, rollout_name

CONTAINER = EXECUTOR_CONTAINER
RAY_CLIENT_PORT = 10001
RAY_DASHBOARD_PORT = 8265
SHARD_DATA_PORT = 10002  # the executor's HTTP side channel for shard bytes (rljob_client.RolloutStream)
EXECUTOR_SPEC_ENV = "RLJOB_EXECUTOR_SPEC"
RAY_GCS_PORT = 6379
EXECUTOR_MODULE = "rollout_executor"


def rollout_address(job: dict[str, Any] | JobView) -> str:
    """Ray Client address of the job's rollout Ray (what trainers pass to RolloutStream)."""
    view = JobView.of(job)
    return f"ray://{rollout_name(view.name)}:{RAY_CLIENT_PORT}"


def executor_command(view: JobView, controller_url: str) -> list[str]:
    cmd = [
        "python", "-m", EXECUTOR_MODULE,
        "--job", view.name,
        "--namespace", view.namespace,
        "--controller-url", controller_url,
        "--engines-url", engines_url(view),
        "--dataset", dataset_path(view.spec.executor.dataset),
    ]  # fmt: skip
    if view.spec.executor.ray_cluster is not None:
        cmd += ["--ray-address", rollout_address(view)]
    state_dir = executor_state_dir(view)
    if state_dir is not None:
        cmd += ["--state-dir", state_dir]
    return cmd


def executor_state_dir(view: JobView) -> str | None:
    """Where the executor saves its dataset position after every rollout all ranks took:
    `<sharedPath>/<job>/executor`, beside the trainer's checkpoints, so that a replaced executor
    pod resumes there instead of handing out the first prompts again. Only where sharedPath is
    shared storage (a PVC, or disk weight sync, which needs one): elsewhere it would be the
    pod's own filesystem, lost with the pod."""
    wu = view.spec.inference.weight_update
    if wu.pvc is None and wu.method is not WeightUpdateMethod.disk:
        return None
    return posixpath.join(wu.shared_path, view.name, "executor")


def executor_spec_json(view: JobView) -> str:
    """The parts of the RLJob spec the executor acts on (sampling, reward, batch size, staleness,
    model/tokenizer, router, trainer shape), as JSON in one env var.

    Only these parts, so that scaling engines (`inference.replicas`) does not change the
    Deployment's pod template and restart the executor mid-rollout.
    """
    spec = view.spec.to_wire()
    inference = {k: v for k, v in spec["inference"].items() if k in ("engine", "router")}
    # the pods' settings, not the executor's
    rollout = {k: v for k, v in spec["rollout"].items() if k not in ("podMetadata", "template")}
    trainer = {k: v for k, v in spec.get("trainer", {}).items() if k not in ("template", "gpuResource")}
    part = {"model": spec["model"], "inference": inference, "rollout": rollout, "trainer": trainer}
    return json.dumps(part, sort_keys=True, separators=(",", ":"))


def _env(view: JobView, controller_url: str) -> list[dict[str, Any]]:
    env = [
        env_value(EXECUTOR_SPEC_ENV, executor_spec_json(view)),
        env_field("POD_IP", "status.podIP"),
        env_value("RLJOB_NAME", view.name),
        env_value("RLJOB_NAMESPACE", view.namespace),
        env_value("RLJOB_CONTROLLER_URL", controller_url),
        env_value("RLJOB_ENGINES_URL", engines_url(view)),
        env_value("RLJOB_MODEL_PATH", model_path(view.spec.model)),
        *ray_auth_env(view),
    ]
    if view.spec.model.tokenizer:
        env.append(env_value("RLJOB_TOKENIZER_PATH", view.spec.model.tokenizer))
    return env


def executor_deployment(
    job: dict[str, Any] | JobView,
    controller_url: str,
    *,
    service_account_name: str | None = None,
) -> dict[str, Any]:
    view = JobView.of(job)
    name = rollout_name(view.name)
    selector = L.role_selector(view.name, L.ROLE_ROLLOUT)
    vols, mounts = volumes(
        model_volume(view.spec.model),
        dataset_volume(view.spec.executor.dataset),
        checkpoints_volume(view.spec.inference.weight_update, read_only=False),  # the state dir
    )
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": view.spec.executor.image,
        "command": executor_command(view, controller_url),
        "env": _env(view, controller_url),
        "ports": [
            {"name": "ray-client", "containerPort": RAY_CLIENT_PORT, "protocol": "TCP"},
            {"name": "dashboard", "containerPort": RAY_DASHBOARD_PORT, "protocol": "TCP"},
            {"name": "gcs", "containerPort": RAY_GCS_PORT, "protocol": "TCP"},
            {"name": "shard-data", "containerPort": SHARD_DATA_PORT, "protocol": "TCP"},
        ],
        "securityContext": restricted_container(),
    }
    if mounts:
        container["volumeMounts"] = mounts
    resources = container_resources(view.spec.executor.resources, 0)
    if resources:
        container["resources"] = resources
    if view.spec.executor.ray_cluster is None:
        container["readinessProbe"] = {"tcpSocket": {"port": "ray-client"}, "periodSeconds": 10}
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "securityContext": restricted_pod(),
        "containers": [container],
    }
    fetch = model_fetch_containers(view.spec, restricted_container()) + dataset_fetch_containers(
        view.spec, restricted_container()
    )
    if fetch:
        pod_spec["initContainers"] = fetch
    if vols:
        pod_spec["volumes"] = vols
    # The executor calls the controller API (engine discovery) as the trainer does: by default it
    # runs as the trainer's ServiceAccount, so the one RoleBinding the README asks for covers both.
    service_account_name = service_account_name or view.spec.trainer.service_account_name
    if service_account_name:
        pod_spec["serviceAccountName"] = service_account_name
    meta = view.spec.executor.pod_metadata
    template_labels = {**meta.labels, **L.job_labels(view.name, L.ROLE_ROLLOUT)}
    template_annotations = {**meta.annotations, L.JOB_NAME_ANNOTATION: view.name}
    template_labels, template_annotations, pod_spec = apply_template(
        template_labels, template_annotations, pod_spec, view.spec.executor.template
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": view.metadata(name, L.ROLE_ROLLOUT),
        "spec": {
            # Suspended (spec.suspend, or Kueue holds the job): the executor's pod goes too, so a
            # preempted job holds none of the quota its Workload's executor PodSet counts.
            "replicas": 0 if view.spec.suspend else 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": template_labels, "annotations": template_annotations},
                "spec": pod_spec,
            },
        },
    }


def executor_service(job: dict[str, Any] | JobView) -> dict[str, Any]:
    """`<job>-rollout`: Ray Client (10001, `ray-client`) and dashboard (8265) of the rollout Ray head."""
    view = JobView.of(job)
    if view.spec.executor.ray_cluster is not None:
        selector = {L.RAY_CLUSTER: ray_cluster_name(view.name), L.RAY_NODE_TYPE: "head"}
    else:
        selector = L.role_selector(view.name, L.ROLE_ROLLOUT)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": view.metadata(rollout_name(view.name), L.ROLE_ROLLOUT),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {
                    "name": "ray-client",
                    "port": RAY_CLIENT_PORT,
                    "targetPort": RAY_CLIENT_PORT,
                    "protocol": "TCP",
                },
                {
                    "name": "dashboard",
                    "port": RAY_DASHBOARD_PORT,
                    "targetPort": RAY_DASHBOARD_PORT,
                    "protocol": "TCP",
                },
                {
                    "name": "shard-data",
                    "port": SHARD_DATA_PORT,
                    "targetPort": SHARD_DATA_PORT,
                    "protocol": "TCP",
                },
            ],
        },
    }
