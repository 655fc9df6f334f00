"""Make the job's children exist: Services, executor, trainer workload, RayCluster.

The builders (`rljob_operator.manifests`) are pure; here they are applied (create or patch,
deterministic names, owner references to the RLJob). Applying is level-based and cheap to
repeat, but not free: it runs when the RLJob's generation changed (spec edits, suspend) and
otherwise every `CHILDREN_RESYNC_SECONDS` to repair drift (a deleted Service comes back).
The trainer Job's outcome is read on every pass: it decides Succeeded/Failed.

A Job's pod template is immutable, so a trainer change that reaches it (replicas changes
WORLD_SIZE, a new image or command) cannot be patched: the API server answers 422. Then the
old Job is deleted and the new one created, which restarts distributed training the way
Kubeflow Trainer and JobSet do when a gang's shape changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rljob_operator.manifests import (
    cells_headless_service,
    engines_service,
    executor_deployment,
    executor_service,
    ray_cluster,
    trainer_workload,
)
from rljob_operator.names import trainer_name
from rljob_operator.platform import PlatformError
from rljob_operator.reconcile.flow import StepResult
from rljob_operator.reconcile.status import TrainerState, trainer_state

if TYPE_CHECKING:
    from rljob_operator.reconcile.health import JobRuntime

CHILDREN_RESYNC_SECONDS = 30.0


def desired_children(job: dict[str, Any], controller_url: str) -> list[dict[str, Any]]:
    """Every child object of the job except engine pods (the controller owns those)."""
    objs = [
        cells_headless_service(job),
        engines_service(job),
        executor_service(job),
        executor_deployment(job, controller_url),
        *trainer_workload(job, controller_url),
    ]
    rc = ray_cluster(job)
    if rc is not None:
        objs.append(rc)
    return objs


async def ensure_children(rt: JobRuntime) -> StepResult:
    now = rt.clock.now()
    gen = rt.generation
    if rt.children_generation != gen or now - rt.children_at >= CHILDREN_RESYNC_SECONDS:
        for obj in desired_children(rt.job_object(), rt.controller_url):
            await apply_child(rt, obj)
        rt.children_generation, rt.children_at = gen, now
    await observe_trainer(rt)
    return StepResult.proceed()


async def apply_child(rt: JobRuntime, obj: dict[str, Any]) -> None:
    try:
        await rt.apply(obj)
    except PlatformError as e:
        if not (e.status == 422 and obj.get("kind") == "Job"):
            raise
        name = obj["metadata"]["name"]
        await rt.kube.delete_job(rt.namespace, name)
        rt.recorder.record("Normal", "TrainerRecreated", f"trainer Job {name} recreated: its pod template changed ({e.status})")
        await recreate_job(rt, obj)


async def recreate_job(rt: JobRuntime, obj: dict[str, Any], attempts: int = 20) -> None:
    """Apply until the deleted Job is gone (a 409/422 while it is still being removed)."""
    for attempt in range(attempts):
        try:
            await rt.apply(obj)
            return
        except PlatformError as e:
            if e.status not in (409, 422) or attempt == attempts - 1:
                raise
            await rt.clock.sleep(0.5)


async def observe_trainer(rt: JobRuntime) -> None:
    spec = rt.spec()
    if spec.trainer.workload_ref is not None or spec.trainer.replicas == 0:
        rt.trainer = (TrainerState.absent, "")
        return
    rt.trainer = trainer_state(await rt.kube.get_job(rt.namespace, trainer_name(rt.name)))
