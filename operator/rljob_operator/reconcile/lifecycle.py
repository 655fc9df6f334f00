"""Suspend/resume, finishing, and deletion after `ttlSecondsAfterFinished`.

- Suspend (`spec.suspend: true`, Kueue-compatible): the controller stops, every engine pod is
  deleted, and the trainer Job is suspended through its own `spec.suspend` (applied by the
  children step, the Job controller deletes its pods); the executor Deployment goes to 0
  replicas and the RayCluster is suspended (their builders read `spec.suspend`). The RLJob
  and its Services stay. The pass waits until no engine pod is left before it reports the job fully
  suspended, so a quick resume never races terminating pods of the same generation.
- Resume: the controller is rebuilt from status; its cells were cleared while suspended, so
  fresh cells start; because a weight version was recorded they wait in PendingWeights for
  the next update instead of serving the stale initial weights.
- Finished (Succeeded/Failed are terminal): engine pods are deleted to free the GPUs; the
  rest stays for inspection until the RLJob is deleted or its TTL passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller_runtime.api.spec import RLJobSpec
from controller_runtime.clock import parse_iso
from rljob_operator.labels import engine_selector, selector_string
from rljob_operator.reconcile.context import JobContext
from rljob_operator.reconcile.engines import EngineFleet
from rljob_operator.reconcile.flow import StepResult
from rljob_operator.reconcile.job_status import TERMINAL


@dataclass(frozen=True)
class EnginesWinding:
    """What a lifecycle step saw: how the pass goes on, and engine pods still existing.

    `engine_pods_left` is None when the step did not look (the job is not finishing), so
    the last count stands.
    """

    result: StepResult
    engine_pods_left: int | None = None


async def delete_engine_pods(job: JobContext, fleet: EngineFleet) -> int:
    """Stop the controller and delete every cell; the number of engine pods still existing.

    Counted straight from the API (terminating pods included): "suspended" must mean the
    pods are gone, not merely marked for deletion, or a quick resume would race them.
    """
    await fleet.stop()
    cells = await fleet.platform.observe_cells()
    for cell in cells:
        await fleet.platform.delete_cell(cell.name)
    return await job.kube.count_pods(job.namespace, selector_string(engine_selector(job.name)))


async def ensure_finished(
    job: JobContext, fleet: EngineFleet, spec: RLJobSpec, stored_status: Mapping[str, Any]
) -> EnginesWinding:
    phase = stored_status.get("phase")
    if phase not in TERMINAL:
        return EnginesWinding(StepResult.proceed())
    left = await delete_engine_pods(job, fleet)
    ttl = spec.ttl_seconds_after_finished
    done = stored_status.get("completionTime")
    if ttl is None or not done:
        return EnginesWinding(StepResult.requeue(job.resync_seconds, f"{phase}"), left)
    due = parse_iso(done) + ttl
    now = job.clock.now()
    if now < due:
        return EnginesWinding(StepResult.requeue(due - now, f"{phase}; deleting after ttlSecondsAfterFinished"), left)
    job.recorder.record("Normal", "TTLExpired", f"deleting the job {ttl} s after it {phase.lower()}")
    await job.kube.delete_rljob(job.namespace, job.name, job.uid)
    return EnginesWinding(StepResult.stop("ttl expired; deleted"), left)


async def ensure_suspension(job: JobContext, fleet: EngineFleet, spec: RLJobSpec) -> EnginesWinding:
    if not spec.suspend:
        return EnginesWinding(StepResult.proceed(), 0)
    was_running = fleet.controller is not None
    left = await delete_engine_pods(job, fleet)
    if was_running:
        job.recorder.record(
            "Normal", "Suspending", "suspended (spec.suspend, or Kueue): deleting engine pods, suspending the trainer"
        )
    if left:
        return EnginesWinding(StepResult.requeue(1.0, f"suspending: {left} engine pods left"), left)
    return EnginesWinding(StepResult.requeue(job.resync_seconds, "suspended"), left)
