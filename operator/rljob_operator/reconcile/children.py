"""Make the job's children exist: Services, executor, trainer workload, RayCluster, policies.

The builders (`rljob_operator.manifests`) are pure; here they are applied (create or patch,
deterministic names, owner references to the RLJob). Applying is level-based and cheap to
repeat, but not free: it runs when the RLJob's generation changed (spec edits, suspend) and
otherwise every `CHILDREN_RESYNC_SECONDS` to repair drift (a deleted Service comes back).
The trainer Job's outcome is read on every pass: it decides Succeeded/Failed.

A Job's pod template is immutable, so a trainer change that reaches it (replicas changes
WORLD_SIZE, a new image or command) cannot be patched: the API server answers 422. Then the
old Job is deleted and the new one created, which restarts distributed training the way
Kubeflow Trainer and JobSet do when a gang's shape changes.

The job's Ray token Secret is created before anything that reads it, once, and never
re-applied (`manifests.rayauth`); the token is drawn here, the only impure part of it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from controller_runtime.api.spec import RLJobSpec
from rljob_operator.kubeapi import Invalid, KubeApiError
from rljob_operator.manifests import (
    cells_headless_service,
    engines_service,
    executor_deployment,
    executor_service,
    network_policies,
    ray_auth_secret,
    ray_cluster,
    trainer_workload,
)
from rljob_operator.names import trainer_name
from rljob_operator.reconcile.context import JobContext
from rljob_operator.reconcile.flow import StepResult
from rljob_operator.reconcile.job_status import TrainerState, trainer_state

CHILDREN_RESYNC_SECONDS = 30.0


@dataclass(frozen=True)
class Applied:
    """When the children were last applied, and from which spec generation."""

    generation: int | None
    at: float


@dataclass(frozen=True)
class ChildrenSeen:
    """What the children step saw: the trainer's outcome, and the last apply."""

    result: StepResult
    applied: Applied | None
    trainer: TrainerState = TrainerState.absent
    trainer_message: str = ""


def desired_children(job: dict[str, Any], controller_url: str) -> list[dict[str, Any]]:
    """Every child object of the job except engine pods (the controller owns those)."""
    objs = [
        cells_headless_service(job),
        engines_service(job),
        executor_service(job),
        executor_deployment(job, controller_url),
        *trainer_workload(job, controller_url),
        *network_policies(job),
    ]
    rc = ray_cluster(job)
    if rc is not None:
        objs.append(rc)
    return objs


async def ensure_children(
    job: JobContext,
    spec: RLJobSpec,
    job_object: dict[str, Any],
    generation: int | None,
    controller_url: str,
    applied: Applied | None,
) -> ChildrenSeen:
    """Apply the children when the spec changed or the resync is due; read the trainer's outcome."""
    now = job.clock.now()
    if applied is None or applied.generation != generation or now - applied.at >= CHILDREN_RESYNC_SECONDS:
        await ensure_ray_auth_secret(job, job_object)
        for obj in desired_children(job_object, controller_url):
            await apply_child(job, obj)
        applied = Applied(generation, now)
    trainer, message = await observe_trainer(job, spec)
    return ChildrenSeen(StepResult.proceed(), applied, trainer, message)


async def ensure_ray_auth_secret(job: JobContext, job_object: dict[str, Any]) -> None:
    """The job's Ray token Secret: created with a fresh token if absent, else left alone."""
    await job.kube.create_if_absent(ray_auth_secret(job_object, secrets.token_urlsafe(32)))


async def apply_child(job: JobContext, obj: dict[str, Any]) -> None:
    try:
        await job.kube.apply(obj)
    except Invalid as e:
        if obj.get("kind") != "Job":
            raise
        name = obj["metadata"]["name"]
        await job.kube.delete_job(job.namespace, name)
        job.recorder.record("Normal", "TrainerRecreated", f"trainer Job {name} recreated: its pod template changed ({e.status})")
        await recreate_job(job, obj)


async def recreate_job(job: JobContext, obj: dict[str, Any], attempts: int = 20) -> None:
    """Apply until the deleted Job is gone (a 409/422 while it is still being removed)."""
    for attempt in range(attempts):
        try:
            await job.kube.apply(obj)
            return
        except KubeApiError as e:
            if e.status not in (409, 422) or attempt == attempts - 1:
                raise
            await job.clock.sleep(0.5)


async def observe_trainer(job: JobContext, spec: RLJobSpec) -> tuple[TrainerState, str]:
    if spec.trainer.workload_ref is not None or spec.trainer.replicas == 0:
        return TrainerState.absent, ""
    return trainer_state(await job.kube.get_job(job.namespace, trainer_name(job.name)))
