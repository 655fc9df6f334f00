"""Suspend/resume, finishing, and deletion after `ttlSecondsAfterFinished`.

- Suspend (`spec.suspend: true`, Kueue-compatible): the controller stops, every engine pod is
  deleted, and the trainer Job is suspended through its own `spec.suspend` (applied by the
  children step, the Job controller deletes its pods). The RLJob, its Services and the
  executor stay. The pass waits until no engine pod is left before it reports the job fully
  suspended, so a quick resume never races terminating pods of the same generation.
- Resume: the controller is rebuilt from status; its cells were cleared while suspended, so
  fresh cells start; because a weight version was recorded they wait in PendingWeights for
  the next update instead of serving the stale initial weights.
- Finished (Succeeded/Failed are terminal): engine pods are deleted to free the GPUs; the
  rest stays for inspection until the RLJob is deleted or its TTL passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller_runtime.clock import parse_iso
from rljob_operator.labels import engine_selector, selector_string
from rljob_operator.reconcile.flow import StepResult
from rljob_operator.reconcile.status import TERMINAL

if TYPE_CHECKING:
    from rljob_operator.reconcile.health import JobRuntime


async def delete_engine_pods(rt: JobRuntime) -> int:
    """Stop the controller and delete every cell; the number of engine pods still existing.

    Counted straight from the API (terminating pods included): "suspended" must mean the
    pods are gone, not merely marked for deletion, or a quick resume would race them.
    """
    await rt.stop_controller()
    cells = await rt.platform.observe_cells()
    for cell in cells:
        await rt.platform.delete_cell(cell.name)
    return await rt.kube.count_pods(rt.namespace, selector_string(engine_selector(rt.name)))


async def ensure_finished(rt: JobRuntime) -> StepResult:
    phase = rt.stored_status.get("phase")
    if phase not in TERMINAL:
        return StepResult.proceed()
    rt.engine_pods_left = await delete_engine_pods(rt)
    ttl = rt.spec().ttl_seconds_after_finished
    done = rt.stored_status.get("completionTime")
    if ttl is None or not done:
        return StepResult.requeue(rt.resync_seconds, f"{phase}")
    due = parse_iso(done) + ttl
    now = rt.clock.now()
    if now < due:
        return StepResult.requeue(due - now, f"{phase}; deleting after ttlSecondsAfterFinished")
    rt.recorder.record("Normal", "TTLExpired", f"deleting the job {ttl} s after it {phase.lower()}")
    await rt.kube.delete_rljob(rt.namespace, rt.name, rt.uid)
    return StepResult.stop("ttl expired; deleted")


async def ensure_suspension(rt: JobRuntime) -> StepResult:
    if not rt.spec().suspend:
        rt.engine_pods_left = 0
        return StepResult.proceed()
    was_running = rt.controller is not None
    rt.engine_pods_left = await delete_engine_pods(rt)
    if was_running:
        rt.recorder.record("Normal", "Suspending", "spec.suspend is true: deleting engine pods, suspending the trainer")
    if rt.engine_pods_left:
        return StepResult.requeue(1.0, f"suspending: {rt.engine_pods_left} engine pods left")
    return StepResult.requeue(rt.resync_seconds, "suspended")
