"""The trainer workload: an Indexed `batch/v1` Job plus the headless Service `<job>-trainer`.

Why an Indexed Job rather than bare pods (the choice Kubeflow Trainer v2 makes through
JobSet, and PyTorchJob before it with its own pods):

* each pod gets a stable rank: the completion index (annotation
  `batch.kubernetes.io/job-completion-index`) becomes `RANK`, and a pod replaced after an
  eviction keeps its index;
* with `subdomain` = the headless Service, Indexed Job pods get the hostnames
  `<job>-trainer-<index>`, so `MASTER_ADDR=<job>-trainer-0.<job>-trainer` is known before any
  pod exists: the torchrun-style rendezvous needs no discovery step;
* the Job controller already does what we would otherwise reimplement: creating missing
  pods, failure accounting (`backoffLimit`, `podFailurePolicy`), `suspend` (which Kueue
  drives), completion, and elastic resizing (`parallelism` and `completions` change
  together for Indexed Jobs).

Failure policy: one failed rank breaks the whole process group (the others fail within their
bounded collective timeout), so the Job fails at the first real failure of any rank
(`backoffLimitPerIndex: 0`, `maxFailedIndexes: 0`: `status.failedIndexes` then names the
rank) and the operator recreates the whole Job, every rank at once, from the newest checkpoint
(`reconcile/trainer_restart.py`), as JobSet's failure policy and Kubeflow's PyTorchJob restart a
torch gang. The Job carries its attempt number. Disruptions (preemption, node drain: the
`DisruptionTarget` condition) are ignored, so an evicted rank is recreated with the same index
instead of failing the job.
"""

from __future__ import annotations

from typing import Any

from controller_runtime.api.podtemplate import TRAINER_CONTAINER
from controller_runtime.api.spec import TrainerSpec
from rljob_operator import labels as L
from rljob_operator.manifests.executor import rollout_address
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.podsecurity import restricted_container, restricted_pod
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
from rljob_operator.manifests.rayauth import ray_auth_env
from rljob_operator.manifests.template import apply_template
from rljob_operator.names import trainer_name

CONTAINER = TRAINER_CONTAINER
MASTER_PORT = 29500
# Each rank serves its Prometheus metrics here (the reference trainer reads RLJOB_TRAINER_METRICS_PORT).
METRICS_PORT = 9464
TRAINER_MODULE = "rljob_client.trainer"


def master_addr(view: JobView) -> str:
    name = trainer_name(view.name)
    return f"{name}-0.{name}"


def trainer_command(view: JobView) -> tuple[list[str], list[str]]:
    """(command, args): the user's command, or the reference trainer configured from the spec."""
    t = view.spec.trainer
    if t.command:
        return list(t.command), list(t.args)
    ref = t.reference
    args = [
        "--model", model_path(view.spec.model),
        "--steps", str(ref.steps),
        "--learning-rate", repr(ref.learning_rate),
        "--algorithm", ref.algorithm,
        *ref.checkpoint_flags(),
        *ref.loss_flags(view.spec.executor.sampling.temperature),
    ]  # fmt: skip
    return ["python", "-m", TRAINER_MODULE], args + list(t.args)


def _env(view: JobView, controller_url: str) -> list[dict[str, Any]]:
    t = view.spec.trainer
    wu = view.spec.inference.weight_update
    env = [
        env_field("POD_IP", "status.podIP"),
        env_value("MASTER_ADDR", master_addr(view)),
        env_value("MASTER_PORT", str(MASTER_PORT)),
        env_value("WORLD_SIZE", str(t.replicas)),
        env_field("RANK", f"metadata.annotations['{L.JOB_COMPLETION_INDEX_ANNOTATION}']"),
        env_value("RLJOB_CONTROLLER_URL", controller_url),
        env_value("RLJOB_NAME", view.name),
        env_value("RLJOB_NAMESPACE", view.namespace),
        # The update window's holder: the Job's name, the same on every restart, so a trainer
        # killed inside a window is known by its next start, which aborts it at once
        # (rljob_client.controller_client.default_holder); its pod's name is new each time.
        env_value("RLJOB_WINDOW_HOLDER", trainer_name(view.name)),
        env_value("RLJOB_ROLLOUT_ADDRESS", rollout_address(view)),
        env_value("RLJOB_MODEL_PATH", model_path(view.spec.model)),
        env_value("RLJOB_WEIGHT_UPDATE_METHOD", str(wu.method)),
        env_value("RLJOB_WEIGHTS_DIR", wu.shared_path),
        env_value("RLJOB_ENGINE", str(view.spec.inference.engine)),
        env_value("RLJOB_PAUSE_MODE", str(wu.pause_mode)),
        env_value("RLJOB_READY_TIMEOUT_SECONDS", f"{wu.ready_timeout_seconds:g}"),
        env_value("RLJOB_TRAINER_METRICS_PORT", str(METRICS_PORT)),
        env_value("RLJOB_OVERLAP", "1" if view.spec.overlaps_generation else "0"),
        env_value("RLJOB_STEPS", str(t.reference.steps)),  # the SDK's job.batches() reads it
        # Offload around training only when the trainer shares the engines' GPUs (colocated).
        env_value("RLJOB_OFFLOAD_TAGS", ",".join(str(tag) for tag in view.spec.inference.offload.tags) if t.colocate else ""),
        *ray_auth_env(view),
    ]
    return merge_env(env, user_env(t.env))


def trainer_service(view: JobView) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": view.metadata(trainer_name(view.name), L.ROLE_TRAINER),
        "spec": {
            "clusterIP": "None",
            "selector": L.role_selector(view.name, L.ROLE_TRAINER),
            "publishNotReadyAddresses": True,
            "ports": [{"name": "master", "port": MASTER_PORT, "targetPort": MASTER_PORT, "protocol": "TCP"}],
        },
    }


def trainer_job(view: JobView, controller_url: str, attempt: int = 0) -> dict[str, Any]:
    t: TrainerSpec = view.spec.trainer
    name = trainer_name(view.name)
    command, args = trainer_command(view)
    vols, mounts = volumes(
        model_volume(view.spec.model),
        checkpoints_volume(view.spec.inference.weight_update, read_only=False),
        shm_volume(),
    )
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": t.image,
        "command": command,
        "env": _env(view, controller_url),
        "ports": [
            {"name": "master", "containerPort": MASTER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "volumeMounts": mounts,
        "securityContext": restricted_container(),
    }
    if args:
        container["args"] = args
    resources = container_resources(t.resources, t.gpus_per_replica, t.gpu_resource)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": name,
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "securityContext": restricted_pod(),
        **placement_fields(t.placement),
        "containers": [container],
        "volumes": vols,
    }
    fetch = model_fetch_containers(view.spec, restricted_container())
    if fetch:
        pod_spec["initContainers"] = fetch
    if t.service_account_name:
        pod_spec["serviceAccountName"] = t.service_account_name
    pod_labels = {**t.pod_metadata.labels, **L.job_labels(view.name, L.ROLE_TRAINER)}
    pod_annotations = {**t.pod_metadata.annotations, L.JOB_NAME_ANNOTATION: view.name}
    pod_labels, pod_annotations, pod_spec = apply_template(pod_labels, pod_annotations, pod_spec, t.template)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": view.metadata(
            name, L.ROLE_TRAINER, annotations={L.TRAINER_ATTEMPT_ANNOTATION: str(attempt)}
        ),
        "spec": {
            "completionMode": "Indexed",
            "completions": t.replicas,
            "parallelism": t.replicas,
            "backoffLimitPerIndex": 0,
            "maxFailedIndexes": 0,
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            },
            "suspend": view.spec.suspend,
            "template": {
                "metadata": {"labels": pod_labels, "annotations": pod_annotations},
                "spec": pod_spec,
            },
        },
    }


def trainer_workload(
    job: dict[str, Any] | JobView, controller_url: str, attempt: int = 0
) -> list[dict[str, Any]]:
    """[headless Service, Indexed Job], or [] when the user runs the trainer (workloadRef) or replicas is 0.

    `attempt`: the trainer restarts so far (the operator reads it back from the live Job)."""
    view = JobView.of(job)
    t = view.spec.trainer
    if t.workload_ref is not None or t.replicas == 0:
        return []
    return [trainer_service(view), trainer_job(view, controller_url, attempt)]
