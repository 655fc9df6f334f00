"""The job's Kueue Workload: create it, follow Kueue's decision, hand the quota back.

Runs first in a pass, for RLJobs labelled `kueue.x-k8s.io/queue-name` only; it returns what
Kueue decided and the pass runs the other steps on a spec that says so (`admitted_spec`):
suspended until admitted, then with the assigned ResourceFlavors' node labels and
tolerations on the pods of each PodSet. So suspension, resume and the engines are the same
code as for `spec.suspend`, and a resumed job keeps its weight version and rollout position.

Decisions (those of Kueue's jobframework for its own job kinds, where one exists):
- the Workload `rljob-<job>` is created once, owned by the RLJob (deleting the RLJob deletes
  it); its PodSets follow `manifests.workload`;
- a spec edit that changes a PodSet count (`inference.replicas`, `trainer.replicas`) while a
  Workload exists deletes it and creates a new one, which queues again: the job is suspended
  and re-admitted with the new counts (Kueue's way for a Job whose PodSets no longer match;
  quota is never held for pods the admission did not count);
- after an eviction the admission is cleared only once no engine pod is left and the trainer
  is suspended, so the quota is free only when the GPUs are;
- a job that ended marks its Workload Finished: Kueue releases the quota.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller_runtime.api.spec import RLJobSpec
from controller_runtime.api.status import Phase
from controller_runtime.clock import iso
from rljob_operator.kinds import (
    KUEUE_API_VERSION,
    KUEUE_GROUP,
    PRIORITY_CLASS_API_VERSION,
    PRIORITY_CLASS_KIND,
    RESOURCE_FLAVOR_KIND,
    WORKLOAD_KIND,
    WORKLOAD_PRIORITY_CLASS_KIND,
)
from rljob_operator.kube.kubeapi import Conflict
from rljob_operator.kueue import (
    FlavorPlacement,
    QueuePhase,
    QueueState,
    finished_patch,
    placement_with,
    queue_state,
    release_quota_patch,
)
from rljob_operator.labels import KUEUE_PRIORITY_CLASS, KUEUE_QUEUE_NAME
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.workload import WorkloadPriority, pod_set_counts, pod_sets, workload
from rljob_operator.names import (
    PODSET_ENGINES,
    PODSET_EXECUTOR,
    PODSET_RAY_HEAD,
    PODSET_RAY_WORKERS,
    PODSET_TRAINER,
    workload_name,
)
from rljob_operator.reconcile.context import JobContext
from rljob_operator.reconcile.job_status import TERMINAL


@dataclass(frozen=True)
class QueueSeen:
    """What Kueue decided for the job, and the flavors' placement of each admitted PodSet."""

    state: QueueState | None = None  # None: no queue-name label, Kueue has no say
    placements: dict[str, tuple[FlavorPlacement, ...]] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        """Whether Kueue keeps the job suspended (not admitted, or evicted)."""
        return (
            self.state is not None and not self.state.admitted and self.state.phase is not QueuePhase.Finished
        )

    @property
    def key(self) -> tuple[Any, ...]:
        """Changes whenever what the pods are built from changes (admission, flavors)."""
        return (self.holds, tuple(sorted((k, v) for k, v in self.placements.items())))


def queue_of(job_object: Mapping[str, Any]) -> str | None:
    return ((job_object.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_NAME) or None


def admitted_spec(spec: RLJobSpec, seen: QueueSeen) -> RLJobSpec:
    """The spec the other steps run on: suspended while Kueue holds the job, else placed on its flavors."""
    if seen.state is None:
        return spec
    if seen.holds:
        return spec.model_copy(update={"suspend": True})
    inference = spec.inference.model_copy(
        update={
            "placement": placement_with(spec.inference.placement, seen.placements.get(PODSET_ENGINES, ()))
        }
    )
    trainer = spec.trainer.model_copy(
        update={"placement": placement_with(spec.trainer.placement, seen.placements.get(PODSET_TRAINER, ()))}
    )
    return spec.model_copy(update={"inference": inference, "trainer": trainer})


UNPLACED_POD_SETS = (PODSET_EXECUTOR, PODSET_RAY_HEAD, PODSET_RAY_WORKERS)


def unplaced_flavors(seen: QueueSeen) -> dict[str, tuple[FlavorPlacement, ...]]:
    """The flavors of the PodSets whose pods have no placement of their own in the spec (the
    executor's Deployment, the RayCluster's groups), by PodSet name."""
    return {name: seen.placements[name] for name in UNPLACED_POD_SETS if seen.placements.get(name)}


async def workload_priority(
    job: JobContext, labels: Mapping[str, str], spec: RLJobSpec
) -> WorkloadPriority | None:
    """The priority Kueue expects: the WorkloadPriorityClass label, else the engines' PriorityClass."""
    if name := labels.get(KUEUE_PRIORITY_CLASS):
        obj = await job.kube.get_object(KUEUE_API_VERSION, WORKLOAD_PRIORITY_CLASS_KIND, None, name)
        if obj is None:
            raise LookupError(f"WorkloadPriorityClass {name!r} (label {KUEUE_PRIORITY_CLASS}) does not exist")
        return WorkloadPriority(int(obj.get("value", 0)), WORKLOAD_PRIORITY_CLASS_KIND, KUEUE_GROUP, name)
    if name := spec.inference.placement.priority_class_name:
        obj = await job.kube.get_object(PRIORITY_CLASS_API_VERSION, PRIORITY_CLASS_KIND, None, name)
        if obj is None:
            raise LookupError(
                f"PriorityClass {name!r} (spec.inference.placement.priorityClassName) does not exist"
            )
        return WorkloadPriority(int(obj.get("value", 0)), PRIORITY_CLASS_KIND, "scheduling.k8s.io", name)
    return None


async def flavor_placements(job: JobContext, state: QueueState) -> dict[str, tuple[FlavorPlacement, ...]]:
    out: dict[str, tuple[FlavorPlacement, ...]] = {}
    for pod_set, flavors in state.flavors.items():
        found = []
        for name in flavors:
            obj = await job.kube.get_object(KUEUE_API_VERSION, RESOURCE_FLAVOR_KIND, None, name)
            if obj is None:
                raise LookupError(f"ResourceFlavor {name!r} assigned to PodSet {pod_set} does not exist")
            found.append(FlavorPlacement.of(obj))
        out[pod_set] = tuple(found)
    return out


async def ensure_workload(
    job: JobContext,
    job_object: Mapping[str, Any],
    controller_url: str,
    stored_status: Mapping[str, Any],
    stopped: bool,
) -> QueueSeen:
    """Make the Workload exist and match the spec; what Kueue decided. `stopped`: no pod of ours runs."""
    queue = queue_of(job_object)
    if queue is None:
        return QueueSeen()
    view = JobView.of(job_object)
    name = workload_name(job.name)
    wl = await job.kube.get_object(KUEUE_API_VERSION, WORKLOAD_KIND, job.namespace, name)
    phase = stored_status.get("phase")
    if phase in TERMINAL:
        if wl is not None and queue_state(queue, wl).phase is not QueuePhase.Finished:
            ok = phase == Phase.Succeeded.value
            patch = finished_patch(wl, ok, f"the RLJob {str(phase).lower()}", iso(job.clock.now()))
            try:
                await job.kube.patch_object_status(
                    KUEUE_API_VERSION, WORKLOAD_KIND, job.namespace, name, patch
                )
            except Conflict:  # Kueue wrote meanwhile: again on the next pass
                return QueueSeen(queue_state(queue, wl))
            job.recorder.record(
                "Normal", "WorkloadFinished", f"Workload {name} marked Finished: its quota is released"
            )
        return QueueSeen(
            QueueState(queue, name, QueuePhase.Finished, str(phase), "the job ended; quota released")
        )
    want = pod_sets(view, controller_url)
    if wl is None:
        labels = (job_object.get("metadata") or {}).get("labels") or {}
        priority = await workload_priority(job, labels, view.spec)
        created = await job.kube.create_object(workload(view, queue, controller_url, priority))
        if created is not None:
            counts = ", ".join(f"{k} {v}" for k, v in pod_set_counts(want).items())
            job.recorder.record(
                "Normal", "WorkloadCreated", f"Workload {name} queued in LocalQueue {queue} ({counts})"
            )
        return QueueSeen(queue_state(queue, created))
    have = pod_set_counts(list((wl.get("spec") or {}).get("podSets") or []))
    if have != pod_set_counts(want):
        await job.kube.delete_object(KUEUE_API_VERSION, WORKLOAD_KIND, job.namespace, name)
        msg = f"PodSet counts changed ({have} -> {pod_set_counts(want)}): Workload {name} recreated, the job queues again"
        job.recorder.record("Normal", "WorkloadRecreated", msg)
        return QueueSeen(QueueState(queue, name, QueuePhase.Pending, "PodSetsChanged", msg))
    state = queue_state(queue, wl)
    if state.phase is QueuePhase.Evicted and state.has_admission and stopped:
        try:
            released = await job.kube.patch_object_status(
                KUEUE_API_VERSION,
                WORKLOAD_KIND,
                job.namespace,
                name,
                release_quota_patch(wl, iso(job.clock.now())),
            )
        except Conflict:
            return QueueSeen(state)  # Kueue wrote meanwhile: decide again on the next pass
        job.recorder.record(
            "Normal",
            "QuotaReleased",
            f"engine pods gone after {state.reason}: admission of {name} cleared, queued again",
        )
        # Report what this pass wrote (Pending), not the Evicted it read: the status written now
        # would otherwise lag the Workload until the next pass.
        state = queue_state(queue, released)
    if not state.admitted:
        return QueueSeen(state)
    return QueueSeen(state, await flavor_placements(job, state))
