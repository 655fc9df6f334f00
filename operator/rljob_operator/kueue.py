"""What Kueue says about an RLJob's Workload, and the Workload status writes Kueue expects. Pure.

Kueue lists RLJob as an external framework (`integrations.externalFrameworks:
[RLJob.v1alpha1.rljob.io]`), so it never touches the RLJob itself: like Kueue's own
jobframework does for a batch Job, the operator creates the Workload, waits for Kueue to
admit it, applies the admission to the pods it creates, stops the job when Kueue evicts it
and then hands the quota back (clears `status.admission`), and marks the Workload Finished
when the job ends. This module reads the Workload's conditions into one `QueueState` and
builds those two status writes; the reconcile step (`reconcile.queueing`) does the I/O.

    no Workload yet ─▶ Pending ──QuotaReserved+Admitted──▶ Admitted ──Evicted──▶ Evicted
                          ▲                                                     │ pods gone:
                          └──────────── admission cleared (Requeued) ◀──────────┘ quota back

Evicted lasts while the admission is still held (the job stopping); Kueue resets the Evicted
condition only when it reserves quota again, so without an admission the job is Pending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controller_runtime.api.spec import Placement, Toleration

# Workload condition types and reasons (sigs.k8s.io/kueue apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"
PREEMPTED = "Preempted"
# Evictions after which Kueue's jobframework sets Requeued=True (the job is queued again at once).
REQUEUE_AFTER = (PREEMPTED, "NodeFailures")


class QueuePhase(StrEnum):
    Pending = "Pending"  # waiting for quota (or for the Workload to be created)
    Admitted = "Admitted"  # Kueue admitted it: the job runs on the assigned flavors
    Evicted = "Evicted"  # Kueue took the admission back (preemption, quota change): stopping
    Finished = "Finished"  # the job ended; its quota is released


@dataclass(frozen=True)
class QueueState:
    """One RLJob's place in Kueue, as `kubectl describe rlj` shows it."""

    queue: str
    workload: str
    phase: QueuePhase
    reason: str
    message: str
    flavors: dict[str, tuple[str, ...]] = field(default_factory=dict)  # PodSet -> assigned ResourceFlavors
    counts: dict[str, int] = field(default_factory=dict)  # PodSet -> admitted count
    has_admission: bool = False

    @property
    def admitted(self) -> bool:
        return self.phase is QueuePhase.Admitted


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The Workload condition of that type (Kueue's metav1.Conditions, not our RLJob's)."""
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def _true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    c = find(conditions, type_)
    return c if c is not None and c.get("status") == "True" else None


def queue_state(queue: str, workload: Mapping[str, Any] | None) -> QueueState:
    """The job's QueueState from its Workload (None: not created yet)."""
    if workload is None:
        return QueueState(
            queue, "", QueuePhase.Pending, "WorkloadPending", f"waiting for a Workload in LocalQueue {queue}"
        )
    name = str((workload.get("metadata") or {}).get("name", ""))
    status = workload.get("status") or {}
    conditions = status.get("conditions") or []
    admission = status.get("admission") or None
    flavors: dict[str, tuple[str, ...]] = {}
    counts: dict[str, int] = {}
    for a in (admission or {}).get("podSetAssignments") or []:
        flavors[str(a.get("name"))] = tuple(sorted(set((a.get("flavors") or {}).values())))
        if a.get("count") is not None:
            counts[str(a.get("name"))] = int(a["count"])
    has = admission is not None

    def state(phase: QueuePhase, reason: str, message: str) -> QueueState:
        return QueueState(queue, name, phase, reason, message, flavors, counts, has)

    if c := _true(conditions, FINISHED):
        return state(QueuePhase.Finished, str(c.get("reason", FINISHED)), str(c.get("message", "")))
    if admission is not None and (c := _true(conditions, EVICTED)):  # stopping; once cleared: Pending
        return state(QueuePhase.Evicted, str(c.get("reason", EVICTED)), str(c.get("message", "")))
    if admission is not None and (c := _true(conditions, ADMITTED)):
        cq = admission.get("clusterQueue", "")
        return state(
            QueuePhase.Admitted, ADMITTED, str(c.get("message", "")) or f"admitted by ClusterQueue {cq}"
        )
    reserved = find(conditions, QUOTA_RESERVED) or {}
    message = str(reserved.get("message") or f"waiting for quota in LocalQueue {queue}")
    return state(QueuePhase.Pending, str(reserved.get("reason") or "Pending"), message)


def _condition(
    type_: str, status: bool, reason: str, message: str, now_iso: str, generation: int | None
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now_iso,
    }
    if generation is not None:
        c["observedGeneration"] = generation
    return c


def _with(conditions: Sequence[Mapping[str, Any]], *new: dict[str, Any]) -> list[dict[str, Any]]:
    """`conditions` with `new` set by type; a condition whose status is unchanged keeps its time."""
    out = [dict(c) for c in conditions]
    for n in new:
        old = next((c for c in out if c.get("type") == n["type"]), None)
        if old is None:
            out.append(n)
            continue
        if old.get("status") == n["status"]:
            n = {**n, "lastTransitionTime": old.get("lastTransitionTime", n["lastTransitionTime"])}
        out[out.index(old)] = n
    return out


def _status_patch(workload: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """A merge patch of the status, conditional on the Workload not having moved meanwhile."""
    rv = (workload.get("metadata") or {}).get("resourceVersion")
    return {"metadata": {"resourceVersion": rv}, "status": status}


def release_quota_patch(workload: Mapping[str, Any], now_iso: str) -> dict[str, Any]:
    """After an eviction, once the job's pods are gone: clear the admission (the quota goes back).

    What Kueue's jobframework writes for its own jobs: QuotaReserved=False (Pending) and
    Admitted=False with the eviction's message, Requeued=True after a preemption so that the
    Workload queues again at once.
    """
    status = workload.get("status") or {}
    conditions = status.get("conditions") or []
    gen = (workload.get("metadata") or {}).get("generation")
    evicted = find(conditions, EVICTED) or {}
    reason, message = str(evicted.get("reason", EVICTED)), str(evicted.get("message", "evicted"))
    new = _with(
        conditions,
        _condition(REQUEUED, reason in REQUEUE_AFTER, reason, message, now_iso, gen),
        _condition(QUOTA_RESERVED, False, "Pending", message, now_iso, gen),
        _condition(ADMITTED, False, "NoReservation", "The workload has no reservation", now_iso, gen),
    )
    return _status_patch(workload, {"admission": None, "conditions": new})


def finished_patch(
    workload: Mapping[str, Any], succeeded: bool, message: str, now_iso: str
) -> dict[str, Any]:
    """Finished=True (Succeeded or Failed): Kueue releases the quota and admits the next Workload."""
    conditions = (workload.get("status") or {}).get("conditions") or []
    gen = (workload.get("metadata") or {}).get("generation")
    reason = "Succeeded" if succeeded else "Failed"
    return _status_patch(
        workload, {"conditions": _with(conditions, _condition(FINISHED, True, reason, message, now_iso, gen))}
    )


@dataclass(frozen=True)
class FlavorPlacement:
    """What a ResourceFlavor asks of the pods admitted on it: node labels and tolerations."""

    node_labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()

    @classmethod
    def of(cls, flavor: Mapping[str, Any]) -> FlavorPlacement:
        spec = flavor.get("spec") or {}
        tolerations = tuple(Toleration.model_validate(t) for t in spec.get("tolerations") or [])
        return cls(dict(spec.get("nodeLabels") or {}), tolerations)


def placement_with(placement: Placement, flavors: Sequence[FlavorPlacement]) -> Placement:
    """The job's own placement plus its PodSet's flavors: node labels added, tolerations appended.

    Kueue's jobframework does the same to a Job's pod template when it starts an admitted Job
    (the flavor's labels win over the template's, a toleration already there is not repeated).
    """
    selector = dict(placement.node_selector)
    tolerations = list(placement.tolerations)
    for f in flavors:
        selector.update(f.node_labels)
        tolerations += [t for t in f.tolerations if t not in tolerations]
    return placement.model_copy(update={"node_selector": selector, "tolerations": tolerations})
