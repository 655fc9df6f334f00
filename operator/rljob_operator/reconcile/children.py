"""Make the job's children exist: Services, executor, trainer workload, RayCluster, policies.

The builders (`rljob_operator.manifests`) are pure; here they are applied (create or patch,
deterministic names, owner references to the RLJob). Every child is applied when the RLJob's
generation changed (spec edits, suspend) and when the operator starts on a job; otherwise,
every `--children-resync` seconds (30), each child is read and applied again only if it is missing or
no longer holds what was applied (`drift.holds`): drift is repaired (a deleted Service comes
back, a hand-edited port is reverted) and a job whose children are as applied costs reads,
never writes (an apply that changes nothing is still a write request), and where the
operator watches the child's kind, not even reads while the child's version is the one last
seen holding what is applied (`child_versions`). The check
waits while the operator's API pool has other work queued, up to `CHILDREN_RESYNC_OVERDUE_SECONDS`:
queued, its reads rank behind all work (`api_pool`), and during a ramp they would wait long,
the job's loop blocked in them all that time (no edit or dead engine acted on).
The trainer Job's outcome is read on every pass: it decides Succeeded/Failed; so does a
workload the user runs (`spec.trainer.workloadRef`, `reconcile.workload_ref`).

A Job's pod template is immutable, so a trainer change that reaches it (replicas changes
WORLD_SIZE, a new image or command) cannot be patched: the API server answers 422. Then the
old Job is deleted and the new one created, which restarts distributed training the way
Kubeflow Trainer and JobSet do when a gang's shape changes. A trainer Job that failed is
recreated the same way, as the next attempt, while `reconcile/trainer_restart.py` allows it.

The job's Ray token Secret is created before anything that reads it, once, and never
re-applied (`manifests.rayauth`); the token is drawn here, the only impure part of it. It is
made with the full apply (never read back: the operator has no permission to read Secrets),
so a deleted token Secret comes back at the next spec change or operator start.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller_runtime.api.spec import Placement, RLJobSpec, Toleration
from controller_runtime.clock import parse_iso
from rljob_operator.child_versions import fingerprint
from rljob_operator.conditions import Want
from rljob_operator.kube.kubeapi import Invalid, KubeApiError
from rljob_operator.kueue import FlavorPlacement, placement_with
from rljob_operator.manifests import (
    PolicyPeers,
    cells_headless_service,
    engines_service,
    executor_deployment,
    executor_service,
    network_policies,
    ray_auth_secret,
    ray_cluster,
    trainer_workload,
)
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.podspec import placement_fields
from rljob_operator.names import PODSET_EXECUTOR, PODSET_RAY_HEAD, PODSET_RAY_WORKERS, trainer_name
from rljob_operator.reconcile.context import JobContext
from rljob_operator.reconcile.drift import holds
from rljob_operator.reconcile.flow import StepResult
from rljob_operator.reconcile.job_status import TrainerState, failed_at, trainer_state
from rljob_operator.reconcile.trainer_restart import (
    TrainerAction,
    TrainerVerdict,
    decide_trainer,
    job_attempt,
)
from rljob_operator.reconcile.workload_ref import observe_workload_ref

CHILDREN_RESYNC_OVERDUE_SECONDS = 300.0  # a check this late is queued even behind work


@dataclass(frozen=True)
class Applied:
    """When the children were last applied, and from which spec generation."""

    generation: Hashable
    at: float
    backoff_noted: int = 0  # the trainer restart whose backoff was reported (one Event per restart)


@dataclass(frozen=True)
class ChildrenSeen:
    """What the children step saw: the trainer's outcome, and the last apply."""

    result: StepResult
    applied: Applied | None
    trainer: TrainerState = TrainerState.absent
    trainer_message: str = ""
    trainer_reason: str = ""
    trainer_restarts: int = 0
    trainer_workload: Want | None = None  # the TrainerWorkload condition of a workloadRef trainer


def placed_on(pod_spec: dict[str, Any], flavors: Sequence[FlavorPlacement]) -> dict[str, Any]:
    """A pod spec with its Kueue flavors' node labels and tolerations added (the executor's and
    the RayCluster's: engines and trainers get theirs through their spec's placement)."""
    if not flavors:
        return pod_spec
    own = Placement(
        node_selector=pod_spec.get("nodeSelector") or {},
        tolerations=[Toleration.model_validate(t) for t in pod_spec.get("tolerations") or []],
    )
    return {**pod_spec, **placement_fields(placement_with(own, flavors))}


def desired_children(
    job: dict[str, Any],
    controller_url: str,
    flavors: Mapping[str, Sequence[FlavorPlacement]] | None = None,
    trainer_attempt: int = 0,
    peers: PolicyPeers | None = None,
) -> list[dict[str, Any]]:
    """Every child object of the job except engine pods (the controller owns those).

    `flavors`: Kueue's flavors by PodSet name for the pods without a placement in the spec.
    A job without spec.rollout has no executor: no Deployment, Service or RayCluster for it."""
    flavors = flavors or {}
    view = JobView.of(job)
    executor: list[dict[str, Any]] = []
    if view.spec.rollout is not None:
        deployment = executor_deployment(view, controller_url)
        template = deployment["spec"]["template"]
        template["spec"] = placed_on(template["spec"], flavors.get(PODSET_EXECUTOR, ()))
        executor = [executor_service(view), deployment]
    objs = [
        cells_headless_service(view),
        engines_service(view),
        *executor,
        *trainer_workload(view, controller_url, trainer_attempt),
        *network_policies(view, peers),
    ]
    rc = ray_cluster(view)
    if rc is not None:
        head = rc["spec"]["headGroupSpec"]["template"]
        head["spec"] = placed_on(head["spec"], flavors.get(PODSET_RAY_HEAD, ()))
        for group in rc["spec"].get("workerGroupSpecs") or []:
            group["template"]["spec"] = placed_on(group["template"]["spec"], flavors.get(PODSET_RAY_WORKERS, ()))
        objs.append(rc)
    return objs


async def ensure_children(
    job: JobContext,
    spec: RLJobSpec,
    job_object: dict[str, Any],
    generation: Hashable,
    controller_url: str,
    applied: Applied | None,
    flavors: Mapping[str, Sequence[FlavorPlacement]] | None = None,
    trainer_restarts: int = 0,
) -> ChildrenSeen:
    """Read the trainer's outcome (restarting a failed one), apply the children when the spec
    changed or the resync is due.

    `generation` is whatever changes when the children must be built anew: the spec's
    generation, and Kueue's admission for a queued job. `trainer_restarts`:
    status.trainerRestarts as stored.
    """
    live = await observe_trainer(job, spec)
    ref = spec.trainer.workload_ref
    ref_seen = await observe_workload_ref(job, ref) if ref is not None else None
    state, message = trainer_state(live) if live is not None else (TrainerState.absent, "")
    now = job.clock.now()
    when = failed_at(live)
    failed_for = now - parse_iso(when) if when else float("inf")
    verdict = decide_trainer(spec.trainer, state, message, max(job_attempt(live), trainer_restarts), failed_for)
    noted = applied.backoff_noted if applied is not None else 0
    if verdict.action is TrainerAction.wait:
        state, message = TrainerState.backoff, verdict.message
        if noted != verdict.attempt:
            job.recorder.record("Warning", verdict.reason, verdict.message)
            noted = verdict.attempt
        # The failed Job stays (its pods and logs are what a user reads) until the restart is due.
        attempt = verdict.attempt - 1
    else:
        attempt = verdict.attempt
    if verdict.action is TrainerAction.restart:
        await restart_trainer(job, spec, job_object, controller_url, verdict)
        state, message, applied = TrainerState.running, "", Applied(generation, now, noted)
    if applied is None or applied.generation != generation:
        if spec.rollout is not None:  # no executor, no Ray, no token
            await ensure_ray_auth_secret(job, job_object)  # before anything that mounts it
        objs = desired_children(job_object, controller_url, flavors, attempt, job.peers)
        await asyncio.gather(*(apply_child(job, obj) for obj in objs))
        applied = Applied(generation, now, noted)
    elif now - applied.at >= job.children_resync_seconds and (
        now - applied.at >= CHILDREN_RESYNC_OVERDUE_SECONDS or not job.kube.has_work_waiting()
    ):
        objs = desired_children(job_object, controller_url, flavors, attempt, job.peers)
        await asyncio.gather(*(reapply_if_drifted(job, obj) for obj in objs))
        applied = Applied(generation, now, noted)
    elif applied.backoff_noted != noted:
        applied = replace(applied, backoff_noted=noted)
    if ref_seen is not None:  # the user's workload: its outcome is the trainer's, never restarted by us
        return ChildrenSeen(StepResult.proceed(), applied, ref_seen.state, ref_seen.message, ref_seen.reason, attempt,
                            ref_seen.condition)  # fmt: skip
    return ChildrenSeen(
        StepResult.proceed(),
        applied,
        state,
        verdict.message if verdict.action is TrainerAction.fail else message,
        verdict.reason if verdict.action is TrainerAction.fail else "",
        attempt,
    )


async def restart_trainer(
    job: JobContext, spec: RLJobSpec, job_object: dict[str, Any], controller_url: str, verdict: TrainerVerdict
) -> None:
    """Delete the failed trainer Job and create it again as `verdict.attempt`: every rank restarts together."""
    name = trainer_name(job.name)
    failed = await job.kube.get_job(job.namespace, name)
    await job.kube.delete_job(job.namespace, name)
    await job_gone(job, name, ((failed or {}).get("metadata") or {}).get("uid"))
    job.recorder.record(
        "Warning",
        "TrainerRestarted",
        f"{verdict.message}; every rank restarts from the newest checkpoint "
        f"(restart {verdict.attempt} of {spec.trainer.max_restarts})",
    )
    for obj in trainer_workload(job_object, controller_url, verdict.attempt):
        await recreate_job(job, obj)


async def job_gone(job: JobContext, name: str, uid: str | None, attempts: int = 20) -> None:
    """Wait until the Job of `uid` is deleted: an apply before that would update the dying Job, not make a new one."""
    for _ in range(attempts):
        live = await job.kube.get_job(job.namespace, name)
        if live is None or (live.get("metadata") or {}).get("uid") != uid:
            return
        await job.clock.sleep(0.5)


async def ensure_ray_auth_secret(job: JobContext, job_object: dict[str, Any]) -> None:
    """The job's Ray token Secret: created with a fresh token if absent, else left alone."""
    await job.kube.create_if_absent(ray_auth_secret(job_object, secrets.token_urlsafe(32)))


async def reapply_if_drifted(job: JobContext, obj: dict[str, Any]) -> None:
    """Apply `obj` again if its child is missing or no longer holds it; read it only when the
    watched versions cannot tell (`child_versions`)."""
    seen = job.children
    desired = fingerprint(obj) if seen is not None else 0
    if seen is not None and seen.unchanged(obj, desired, job.clock.now()):
        return
    stored = await job.kube.get_stored(obj)
    if holds(stored, obj):
        if seen is not None:
            seen.verified(obj, desired, stored, job.clock.now())
        return
    await apply_child(job, obj)


async def apply_child(job: JobContext, obj: dict[str, Any]) -> None:
    try:
        stored = await job.kube.apply(obj)
        if job.children is not None:
            job.children.verified(obj, fingerprint(obj), stored, job.clock.now())
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


async def observe_trainer(job: JobContext, spec: RLJobSpec) -> dict[str, Any] | None:
    """The trainer Job as stored, or None when the trainer pods are not ours (or not there)."""
    if spec.trainer.workload_ref is not None or spec.trainer.replicas == 0:
        return None
    return await job.kube.get_job(job.namespace, trainer_name(job.name))
