"""Engine cell pods: one cell = ceil(gpusPerEngine / gpusPerNode) pods running one engine.

Design choices (why):

* Bare pods, restartPolicy Never, no owning StatefulSet/LeaderWorkerSet: the cell is the unit
  of restart (docs/design.md), so the controller deletes and recreates whole cells itself, with a
  new generation in the pod names; a kubelet restarting one container of a multi-node
  engine would leave the others wedged in a broken process group. For the same reason there
  is no livenessProbe: health is the controller's probe, which also knows when an engine is
  legitimately unresponsive (offloaded, mid weight update).
* Names `<job>-cell-<index>-g<generation>-<podIndex>` are deterministic, so creating a cell
  twice is a 409, never a second cell.
* hostname = pod name and subdomain = `<job>-cells` (headless, publishNotReadyAddresses) give
  each pod a DNS name before it is ready, which multi-node rendezvous needs.
* Multi-node vLLM follows LeaderWorkerSet's vLLM recipe (and KubeRay's head/worker split):
  pod 0 starts a Ray head, waits until every pod of the cell has joined, then runs the
  OpenAI server with `--distributed-executor-backend ray` (TP within a node, PP across
  nodes); pods 1.. wait for the head's GCS port, then `ray start --block`, so a worker exits
  (and its pod fails, and the controller recreates the cell) when the head goes away.
  Multi-node SGLang needs no Ray: every pod runs `sglang.launch_server` with
  `--nnodes/--node-rank/--dist-init-addr <pod 0>`.
* Only pod 0 of a cell serves HTTP, so only pod 0 has the readinessProbe and the `http` port.
* vLLM gets `VLLM_SERVER_DEV_MODE=1` (sleep/wake, pause/resume, collective_rpc and weight
  routes the controller drives). vLLM 0.32 workers implement `reload_weights` natively
  (called through `/collective_rpc`), so no `--worker-extension-cls` is needed for disk
  updates; `--enable-sleep-mode` is added when offload is enabled and
  `--weight-transfer-config` when weights arrive over NCCL.
"""

from __future__ import annotations

from typing import Any

from controller_runtime.api.podtemplate import ENGINE_CONTAINER
from controller_runtime.engines import EngineLaunch, engine, parallel_sizes
from controller_runtime.ports import CellRequest
from rljob_operator import labels as L
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.podspec import (
    checkpoints_volume,
    container_resources,
    env_field,
    env_value,
    merge_env,
    model_fetch_containers,
    model_path,
    model_volume,
    placement_fields,
    shm_volume,
    user_env,
    volumes,
)
from rljob_operator.manifests.template import apply_template
from rljob_operator.names import cells_service_name, engine_pod_name

CONTAINER = ENGINE_CONTAINER

__all__ = ["CONTAINER", "engine_command", "engine_pod", "engine_pods", "head_address", "parallel_sizes"]


def head_address(job: JobView, cell: CellRequest) -> str:
    """DNS name of pod 0 of the cell (through the headless `<job>-cells` Service)."""
    head = engine_pod_name(job.name, cell.index, cell.generation, 0)
    return f"{head}.{job.service_host(cells_service_name(job.name))}"


def engine_command(job: JobView, cell: CellRequest, pod_index: int) -> list[str]:
    """argv of pod `pod_index` of the cell (Kubernetes expands `$(POD_IP)`): the engine table's builder."""
    launch = EngineLaunch(job.spec.inference, model_path(job.spec.model), job.spec.model.tokenizer, pod_index,
                          head_address(job, cell))
    return engine(job.spec.inference.engine).argv(launch)


def _engine_env(job: JobView) -> list[dict[str, Any]]:
    env = [env_field("POD_IP", "status.podIP"), env_field("POD_NAME", "metadata.name")]
    env += [env_value(name, value) for name, value in engine(job.spec.inference.engine).env]
    return merge_env(env, user_env(job.spec.inference.env))


def _readiness_probe(job: JobView) -> dict[str, Any]:
    hc = job.spec.inference.health_check
    return {
        "httpGet": {"path": engine(job.spec.inference.engine).health_route, "port": "http"},
        "periodSeconds": 10,
        "timeoutSeconds": max(1, min(int(hc.timeout_seconds), 10)),
        "failureThreshold": 3,
    }


def _ports(job: JobView, pod_index: int) -> list[dict[str, Any]]:
    inf = job.spec.inference
    if pod_index != 0:
        return []
    ports = [{"name": "http", "containerPort": inf.port, "protocol": "TCP"}]
    dist_init = engine(inf.engine).dist_init
    if inf.pods_per_cell > 1 and dist_init is not None:
        ports.append({"name": dist_init[0], "containerPort": dist_init[1], "protocol": "TCP"})
    return ports


def engine_pod(job: JobView, cell: CellRequest, pod_index: int) -> dict[str, Any]:
    """Pod `pod_index` of the cell."""
    inf = job.spec.inference
    name = engine_pod_name(job.name, cell.index, cell.generation, pod_index)
    labels = {
        **inf.pod_metadata.labels,
        **cell.labels,
        **L.job_labels(job.name, L.ROLE_ENGINE),
        L.CELL: L.label_value(cell.name),
        L.CELL_INDEX: str(cell.index),
        L.GENERATION: str(cell.generation),
        L.POD_INDEX: str(pod_index),
        # the head's alone (`labels.serving_selector`): one label write per cell, not per pod; a
        # head created serving joins the `-engines` Service when its readinessProbe passes
        **({L.SERVING: "true" if cell.serving else "false"} if pod_index == 0 else {}),
    }
    annotations = {**inf.pod_metadata.annotations, L.CELL_NAME_ANNOTATION: cell.name}
    vols, mounts = volumes(
        model_volume(job.spec.model),
        checkpoints_volume(inf.weight_update, read_only=True),
        shm_volume(),
    )
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": inf.image,
        "command": engine_command(job, cell, pod_index),
        "env": _engine_env(job),
        "resources": container_resources(inf.resources, inf.gpus_per_pod if inf.gpus_per_engine > 0 else 0, inf.gpu_resource),
        "volumeMounts": mounts,
    }
    ports = _ports(job, pod_index)
    if ports:
        container["ports"] = ports
        container["readinessProbe"] = _readiness_probe(job)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": cells_service_name(job.name),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        **placement_fields(inf.placement),
        "containers": [container],
        "volumes": vols,
    }
    fetch = model_fetch_containers(job.spec, None)
    if fetch:
        spec["initContainers"] = fetch
    labels, annotations, spec = apply_template(labels, annotations, spec, inf.template)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": job.metadata(name, L.ROLE_ENGINE, labels=labels, annotations=annotations),
        "spec": spec,
    }


def engine_pods(job: dict[str, Any] | JobView, cell: CellRequest) -> list[dict[str, Any]]:
    """Every pod of one cell at one generation.

    The pod count comes from the spec (ceil(gpusPerEngine/gpusPerNode)), the authority for
    the cell's shape; `cell.pods` is not consulted.
    """
    view = JobView.of(job)
    return [engine_pod(view, cell, i) for i in range(view.spec.inference.pods_per_cell)]
