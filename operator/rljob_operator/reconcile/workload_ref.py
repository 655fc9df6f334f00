"""The trainer a user runs (`spec.trainer.workloadRef`): its outcome, read every pass.

The referenced workload is read every pass, as the operator's own trainer Job is (`children`):
from the watch's cache where its kind is watched (`workload_cache`), else with a GET; its
status conditions mapped through the kind's row of `TRAINER_WORKLOADS` (which
condition type means finished, failed, suspended), never a branch per kind. Its outcome ends the
RLJob like the operator's trainer Job's does: Succeeded when it succeeds, Failed with its
condition's reason and message when it fails; the engines are then deleted and their GPUs freed.
The operator never restarts, suspends or deletes it: that is its own controller's work.

What the pass saw is also the `TrainerWorkload` condition, so that `kubectl describe` tells a
workload that does not exist yet, or a kind the API server does not serve, from one that runs.
Kueue admits a referenced workload as a Workload of its own, apart from the RLJob's engines: the
condition says so while it runs or waits suspended.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller_runtime.api.spec import WorkloadRef
from controller_runtime.api.status import ConditionType
from controller_runtime.api.workloads import UNSUPPORTED_WORKLOAD_MSG, WorkloadKind, workload_kind
from rljob_operator.conditions import Want
from rljob_operator.kube.kubeapi import NotFound
from rljob_operator.reconcile.context import JobContext
from rljob_operator.reconcile.job_status import TrainerState

REASON_FAILED = "TrainerWorkloadFailed"
REASON_MISSING = "TrainerWorkloadMissing"
REASON_NOT_SERVED = "TrainerWorkloadKindNotServed"
KUEUE_NOTE = "Kueue, if it queues it, admits it as a Workload of its own, apart from this RLJob's engines"


@dataclass(frozen=True)
class WorkloadSeen:
    """The referenced workload's outcome as the job's status takes it."""

    state: TrainerState
    condition: Want  # the TrainerWorkload condition
    reason: str = ""  # the Failed condition's reason when it fails the job
    message: str = ""  # ... and its message


def describe(ref: WorkloadRef) -> str:
    """`batch/v1 Job my-trainer`: how messages name the workload."""
    return f"{ref.api_version} {ref.kind} {ref.name}"


def _true(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def workload_outcome(row: WorkloadKind, ref: WorkloadRef, obj: Mapping[str, Any]) -> WorkloadSeen:
    """The outcome of `obj` (the stored workload) from its conditions, by its kind's row. Pure."""
    T, what = ConditionType.TrainerWorkload, describe(ref)
    failed = _true(obj, row.failed)
    if failed is not None:
        why = " ".join(p for p in (failed.get("reason") or "", failed.get("message") or "") if p)
        msg = f"{what} failed" + (f": {why}" if why else "")
        return WorkloadSeen(TrainerState.failed, Want(T, True, "Failed", msg), REASON_FAILED, msg)
    done = _true(obj, row.succeeded)
    if done is not None:
        msg = f"{what} succeeded" + (f": {done['message']}" if done.get("message") else "")
        return WorkloadSeen(TrainerState.succeeded, Want(T, True, "Succeeded", msg), "", msg)
    if _true(obj, row.suspended) is not None:
        msg = f"{what} is suspended (its spec.suspend, or Kueue has not admitted it yet); {KUEUE_NOTE}"
        return WorkloadSeen(TrainerState.suspended, Want(T, True, "Suspended", msg))
    return WorkloadSeen(TrainerState.running, Want(T, True, "Running", f"{what} is running; {KUEUE_NOTE}"))


def missing(ref: WorkloadRef) -> WorkloadSeen:
    """The workload does not exist (yet): the engines serve, and the job waits for it, saying so."""
    msg = (f"{describe(ref)} does not exist in the RLJob's namespace: create it, or fix spec.trainer.workloadRef.name; "
           "the job ends when it does")  # fmt: skip
    return WorkloadSeen(TrainerState.absent, Want(ConditionType.TrainerWorkload, False, REASON_MISSING, msg))


def not_served(ref: WorkloadRef, row: WorkloadKind) -> WorkloadSeen:
    """The API server does not serve the kind: its controller (and CRD) is not installed."""
    msg = (f"the API server does not serve {row.plural}.{row.group or 'core'}/{row.api_version.rpartition('/')[2]}: "
           f"install the controller of {row.kind} (its CRD), or name another kind in spec.trainer.workloadRef")  # fmt: skip
    return WorkloadSeen(TrainerState.absent, Want(ConditionType.TrainerWorkload, False, REASON_NOT_SERVED, msg))


async def observe_workload_ref(job: JobContext, ref: WorkloadRef) -> WorkloadSeen:
    """Read the referenced workload once and say what it is."""
    row = workload_kind(ref.api_version, ref.kind)
    if row is None:  # the spec's validator refuses such a ref: a spec that has one is never acted on
        raise ValueError(UNSUPPORTED_WORKLOAD_MSG)
    cache = job.workloads
    if cache is not None:
        cache.follow((job.namespace, job.name), (row.key, job.namespace, ref.name))
        known, obj = cache.lookup(row.key, job.namespace, ref.name)
        if known:
            return missing(ref) if obj is None else workload_outcome(row, ref, obj)
    try:
        obj = await job.kube.get_workload(row.api_version, row.kind, job.namespace, ref.name)
    except NotFound:
        return not_served(ref, row)
    return missing(ref) if obj is None else workload_outcome(row, ref, obj)
