"""The RLJob status a person reads: phase, conditions, printer counts. Pure.

`build_status` merges what the controller owns (`InferenceController.status_patch()`:
engines, lock, weight version, counts) with what the operator observes around it (spec
suspend, the trainer Job's outcome) into the whole status we write. Phases:

    Pending -> Starting -> Running -> Succeeded | Failed;  Suspended while spec.suspend,
    or while Kueue holds the job (not admitted yet, or evicted).

Decisions:
- Succeeded when the trainer Job (or the workload of spec.trainer.workloadRef) completes.
  Failed when it fails, or when every
  engine cell has spent its restart budget (no engine can serve, so training cannot go on).
  A single exhausted cell degrades the job (EnginesHealthy=False, RestartBudgetExhausted)
  but does not fail it while other cells serve.
- Succeeded and Failed are terminal: they never change back (the TTL clock starts there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controller_runtime.api.status import CellState, ConditionType, Phase
from controller_runtime.clock import iso, parse_iso
from rljob_operator.conditions import Want, find, merge_conditions, transitions
from rljob_operator.kueue import QueuePhase, QueueState

TERMINAL = (Phase.Succeeded.value, Phase.Failed.value)
CONTROLLER_KEYS = ("engines", "lock", "weightVersion", "rolloutId", "readyEngines", "totalEngines", "ready", "restartsTotal",
                   "lastEval")


class TrainerState(StrEnum):
    absent = "absent"  # no trainer pods of ours (workloadRef, replicas 0, or not created yet)
    running = "running"
    suspended = "suspended"
    succeeded = "succeeded"
    failed = "failed"
    backoff = "backoff"  # failed, and restarted once its backoff is over (reconcile/trainer_restart.py)


def failed_at(job: Mapping[str, Any] | None) -> str | None:
    """When the Job failed: its Failed condition's lastTransitionTime (RFC 3339), if any."""
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return c.get("lastTransitionTime") or None
    return None


def trainer_state(job: Mapping[str, Any] | None) -> tuple[TrainerState, str]:
    """A batch/v1 Job's outcome from its conditions (Complete / Failed / Suspended)."""
    if not job:
        return TrainerState.absent, ""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return TrainerState.succeeded, c.get("message") or "trainer Job completed"
        if c.get("type") == "Failed":
            ranks = (job.get("status") or {}).get("failedIndexes")
            failed = f"trainer Job failed: {c.get('reason', '')} {c.get('message', '')}".strip()
            return TrainerState.failed, f"{failed} (failed rank: {ranks})" if ranks else failed
        if c.get("type") == "Suspended":
            return TrainerState.suspended, ""
    return TrainerState.running, ""


@dataclass(frozen=True)
class Observed:
    now: float
    generation: int | None = None
    suspend: bool = False  # spec.suspend, or Kueue holds the job
    replicas: int = 0  # spec.inference.replicas
    controller: Mapping[str, Any] | None = None  # status_patch(), None while no controller runs
    trainer: TrainerState = TrainerState.absent
    trainer_message: str = ""
    trainer_reason: str = ""  # the Failed condition's reason when the trainer fails the job
    trainer_restarts: int = 0  # times the trainer gang was recreated (reconcile/trainer_restart.py)
    engine_pods_left: int = 0  # engine pods still existing while suspending/finishing
    queue: QueueState | None = None  # Kueue's decision; None for a job without a queue-name label
    trainer_workload: Want | None = None  # TrainerWorkload: a workloadRef trainer as last read; None without one
    extra: dict[str, Any] = field(default_factory=dict)


def _engine_states(engines: list[Mapping[str, Any]]) -> list[str]:
    return [str(e.get("state", CellState.Pending.value)) for e in engines]


def build_status(prev: Mapping[str, Any] | None, obs: Observed) -> tuple[dict[str, Any], list[Mapping[str, Any]]]:
    """(status to write, conditions that changed). `prev` is the status as stored now."""
    prev = dict(prev or {})
    now_iso = iso(obs.now)
    out: dict[str, Any] = {k: prev.get(k) for k in CONTROLLER_KEYS if k in prev}
    if obs.controller is not None:
        out.update({k: obs.controller.get(k) for k in CONTROLLER_KEYS})
    engines: list[Mapping[str, Any]] = list(out.get("engines") or [])
    if obs.controller is None and (obs.suspend or prev.get("phase") in TERMINAL):
        # No controller runs and the engine pods are being (or were) deleted: show no cells.
        engines = []
        out.update(engines=[], lock=None, readyEngines=0, totalEngines=obs.replicas, ready=f"0/{obs.replicas}")
    states = _engine_states(engines)
    total = int(out.get("totalEngines") or len(engines) or obs.replicas)
    ready = int(out.get("readyEngines") or states.count(CellState.Serving.value))
    out["totalEngines"], out["readyEngines"], out["ready"] = total, ready, f"{ready}/{total}"

    failed_cells = states.count(CellState.Failed.value)
    unhealthy = [str(e.get("name")) for e in engines if e.get("state") == CellState.Unhealthy.value]
    exhausted = [str(e.get("name")) for e in engines if e.get("state") == CellState.Failed.value]
    all_exhausted = bool(engines) and failed_cells == len(engines)

    prev_phase = prev.get("phase")
    failed_reason, failed_msg = "", ""
    if prev_phase in TERMINAL:
        phase = prev_phase
        old = find(prev.get("conditions"), ConditionType.Failed.value) or {}
        failed_reason, failed_msg = old.get("reason", ""), old.get("message", "")
    elif obs.trainer is TrainerState.failed:
        phase, failed_reason, failed_msg = (
            Phase.Failed.value,
            obs.trainer_reason or "TrainerFailed",
            obs.trainer_message,
        )
    elif all_exhausted and not obs.suspend:
        phase, failed_reason = Phase.Failed.value, "RestartBudgetExhausted"
        failed_msg = f"every engine cell spent its restart budget: {', '.join(exhausted)}"
    elif obs.trainer is TrainerState.succeeded:
        phase = Phase.Succeeded.value
    elif obs.suspend:
        phase = Phase.Suspended.value
    elif ready > 0:
        phase = Phase.Running.value
    elif engines:
        phase = Phase.Starting.value
    else:
        phase = Phase.Pending.value
    out["phase"] = phase
    restarts = max(int(prev.get("trainerRestarts") or 0), obs.trainer_restarts)
    if restarts:
        out["trainerRestarts"] = restarts
    if prev.get("startTime"):
        out["startTime"] = prev["startTime"]
    elif phase == Phase.Running.value:
        out["startTime"] = now_iso
    if phase in TERMINAL:
        out["completionTime"] = prev.get("completionTime") or now_iso
    if obs.generation is not None:
        out["observedGeneration"] = obs.generation
    if obs.queue is not None:
        out["queue"] = queue_status(obs.queue)
    elif prev.get("queue") is not None:
        out["queue"] = None  # the queue-name label was removed

    wants = _wants(phase, obs, ready, total, unhealthy, exhausted, failed_reason, failed_msg, out.get("lock"))
    out["conditions"] = merge_conditions(prev.get("conditions"), wants, now_iso, obs.generation)
    return out, transitions(prev.get("conditions"), out["conditions"])


def queue_status(q: QueueState) -> dict[str, Any]:
    """`status.queue` (the models' QueueStatus, camelCase)."""
    return {
        "name": q.queue,
        "workload": q.workload,
        "state": q.phase.value,
        "reason": q.reason,
        "message": q.message,
        # A list, not a map: a merge patch replaces it whole, so a flavor never outlives its admission.
        "flavors": [f"{k}: {','.join(v)}" for k, v in sorted(q.flavors.items())],
    }


def held_by_queue(obs: Observed) -> QueueState | None:
    """Kueue's state when it is what keeps the job suspended (waiting for quota, or evicted)."""
    q = obs.queue
    return q if q is not None and q.phase in (QueuePhase.Pending, QueuePhase.Evicted) else None


def _suspended_why(obs: Observed) -> tuple[str, str]:
    """(reason, message) of a suspended job: Kueue's when Kueue holds it, else the spec's."""
    q = held_by_queue(obs)
    if q is None:
        return "SuspendedBySpec", "spec.suspend is true"
    if q.phase is QueuePhase.Evicted:
        return "EvictedByKueue", f"Kueue evicted the job ({q.reason}): {q.message}"
    return "QueuedByKueue", f"waiting for Kueue to admit Workload {q.workload or '(creating)'}: {q.message}"


def _wants(
    phase: str,
    obs: Observed,
    ready: int,
    total: int,
    unhealthy: list[str],
    exhausted: list[str],
    failed_reason: str,
    failed_msg: str,
    lock: Mapping[str, Any] | None,
) -> list[Want]:
    T = ConditionType
    terminal = phase in TERMINAL
    counts = f"{ready}/{total} engine cells serving"
    if terminal:
        ready_w = Want(T.Ready, False, phase, f"the job {phase.lower()}")
    elif obs.suspend:
        ready_w = Want(T.Ready, False, "Suspended", _suspended_why(obs)[1])
    elif total > 0 and ready == total:
        ready_w = Want(T.Ready, True, "AllEnginesServing", counts)
    else:
        ready_w = Want(T.Ready, False, "EnginesNotReady", counts)

    if exhausted:
        healthy_w = Want(T.EnginesHealthy, False, "RestartBudgetExhausted", f"restart budget spent: {', '.join(exhausted)}")
    elif unhealthy:
        healthy_w = Want(T.EnginesHealthy, False, "CellsUnhealthy", f"unhealthy: {', '.join(unhealthy)}")
    elif obs.suspend or terminal or obs.controller is None:
        healthy_w = Want(T.EnginesHealthy, None, "NotRunning", "no engines are running")
    else:
        healthy_w = Want(T.EnginesHealthy, True, "NoFailures", counts)

    if terminal:
        progressing_w = Want(T.Progressing, False, phase, "")
    elif obs.suspend:
        progressing_w = Want(T.Progressing, False, "Suspended", _suspended_why(obs)[1])
    elif lock:
        progressing_w = Want(T.Progressing, True, "UpdatingWeights", f"update window held by {lock.get('holder')}")
    elif total > 0 and ready < total:
        progressing_w = Want(T.Progressing, True, "EnginesStarting", counts)
    else:
        progressing_w = Want(T.Progressing, True, "Running", counts)

    if obs.suspend and not terminal:
        done = obs.controller is None and obs.engine_pods_left == 0
        msg = "engine and trainer pods deleted" if done else f"deleting engine pods ({obs.engine_pods_left} left)"
        reason, why = _suspended_why(obs)
        suspended_w = Want(T.Suspended, True, reason, msg if reason == "SuspendedBySpec" else f"{why}; {msg}")
    else:
        suspended_w = Want(T.Suspended, False, "NotSuspended", "")

    if phase == Phase.Failed.value:
        failed_w = Want(T.Failed, True, failed_reason or "Failed", failed_msg)
    else:
        failed_w = Want(T.Failed, False, "NotFailed", "")
    wants = [ready_w, healthy_w, progressing_w, suspended_w, failed_w]
    if obs.queue is not None:
        q = obs.queue
        wants.append(Want(T.Admitted, q.admitted, q.reason or q.phase.value, q.message))
    if obs.trainer_workload is not None:
        wants.append(obs.trainer_workload)
    return wants


PROBE_TIME = "lastProbeTime"
FAILURES = "consecutiveFailures"
PENDING_BOOKKEEPING = frozenset({"pods", "endpoint"})
# How long a Pending cell's pod names and endpoint wait for its next change before they are
# written on their own: a cell still Pending after this is stuck (unschedulable, a quota) and
# `kubectl describe` should name its pods; one that serves sooner writes them with that change.
PENDING_QUIET_SECONDS = 30.0


def _engine_news(held: Mapping[str, Any] | None, new: Mapping[str, Any], now: float) -> bool:
    """Whether one cell's entry `new`, against `held` as stored, is worth a write of its own."""
    if held is None:
        return True
    changed = {k for k in set(held) | set(new) if k != PROBE_TIME and held.get(k) != new.get(k)}
    if FAILURES in changed and not held.get(FAILURES):
        changed.discard(FAILURES)  # a count below the threshold: the state did not move
    if changed and changed <= PENDING_BOOKKEEPING and held.get("state") == new.get("state") == CellState.Pending:
        try:
            pending_for = now - parse_iso(str(new.get("lastTransitionTime")))
        except ValueError:
            return True
        return pending_for >= PENDING_QUIET_SECONDS
    return bool(changed)


def quiet_delta(stored: Mapping[str, Any] | None, delta: Mapping[str, Any], now: float) -> bool:
    """Whether a non-empty `delta` changes only what is not written on its own.

    Such a delta is not written; it goes out with the job's next real change, and the gauges
    (`rljob_cell_last_probe_age_seconds`, `rljob_cell_consecutive_probe_failures`) carry it live:

    - cells' `lastProbeTime`: a health probe that changed nothing must cost the API server
      nothing, and every job's cells are probed all the time;
    - a failed probe below `failureThreshold` (`consecutiveFailures` 0 -> k, the state
      unchanged): under load probes time out, and writing each failure (and the success that
      reset it) loads the API server just when it is the bottleneck. The kubelet flips a pod's
      readiness at the threshold, not at each failure. A count already written (it went out
      with another change) is kept true: its reset is written;
    - a Pending cell's pod names and endpoint, for its first `PENDING_QUIET_SECONDS`: they come
      in as the pods are made and scheduled, a pass or two before the cell starts, and written
      each on its own they would be a large share of a ramp's status writes. A cell Pending
      longer has them written.
    """
    if set(delta) != {"engines"} or not isinstance(delta["engines"], list):
        return False
    held = {e.get("name"): e for e in (stored or {}).get("engines") or [] if isinstance(e, dict)}
    new = delta["engines"]
    if len(new) != len(held) or not all(isinstance(e, dict) for e in new):
        return False
    return not any(_engine_news(held.get(e.get("name")), e, now) for e in new)


# How long a pass's start-up progress waits for the job's other cells (`startup_progress`).
STARTUP_HOLD_SECONDS = 2.0
_HOLDABLE_KEYS = frozenset({"engines", "conditions", "phase", "ready", "readyEngines", "startTime"})
_STARTING = frozenset({CellState.Pending, CellState.Starting})
_STARTED = frozenset({CellState.Starting, CellState.Serving})
_NOT_PROGRESS = ("generation", "restarts", "podRestarts", "memory", "stateBeforeOffload", "nextRestartTime")
# A condition's value that is news whenever it is reached: an Event, and never held.
NEWS = {"EnginesHealthy": "False", "Failed": "True", "Suspended": "True", "Ready": "True", "Admitted": "True",
        "TrainerWorkload": "False"}


def is_news(c: Mapping[str, Any]) -> bool:
    return NEWS.get(c.get("type", "")) == c.get("status")


def startup_progress(stored: Mapping[str, Any] | None, status: Mapping[str, Any], delta: Mapping[str, Any]) -> bool:
    """Whether `delta` only tells that some cells began serving while others of the job still start.

    Such a change may wait up to `STARTUP_HOLD_SECONDS` for the rest (`StatusWriter`): the
    job's all-serving write nearly always follows within that time, so one write tells what two
    would, on an API server whose CPU a ramp waits for. The write that makes the job Ready, any
    cell that goes elsewhere (Unhealthy, Failed, PendingWeights), a condition that becomes news
    (`NEWS`), a new generation observed: none of these wait.
    """
    if not stored or not delta or not set(delta) <= _HOLDABLE_KEYS:
        return False
    before = {c.get("type"): c.get("status") for c in stored.get("conditions") or []}
    if any(is_news(c) and before.get(c.get("type")) != c.get("status") for c in status.get("conditions") or []):
        return False
    held = {e.get("name"): e for e in stored.get("engines") or [] if isinstance(e, dict)}
    cells = status.get("engines") or []
    if len(cells) != len(held):
        return False
    began_serving = False  # none did (a fleet that starts loading): written at once
    for cell in cells:
        old = held.get(cell.get("name"))
        if old is None or any(old.get(k) != cell.get(k) for k in _NOT_PROGRESS):
            return False
        was, now = old.get("state"), cell.get("state")
        if was != now:
            if was not in _STARTING or now not in _STARTED:
                return False
            began_serving |= now == CellState.Serving
        elif now not in _STARTING | _STARTED:
            return False
    return began_serving


def status_delta(stored: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch turning `stored` into `wanted` for the keys we own (None deletes)."""
    stored = stored or {}
    patch: dict[str, Any] = {}
    for k, v in wanted.items():
        if stored.get(k) != v:
            patch[k] = v
    return patch
