"""The per-job gauges as pure values: (metric, extra labels, value) from a status and a time.

Kept apart from `metrics.py` so that what a scrape shows for a given status is a function a
unit test can call, without a registry or a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller_runtime.api.status import CellState, Phase
from controller_runtime.clock import parse_iso

Sample = tuple[str, tuple[str, ...], float]


@dataclass
class JobSnapshot:
    status: dict[str, Any] = field(default_factory=dict)  # the status as last written
    max_restarts: int | None = None  # spec.inference.restartPolicy.maxRestarts, once known


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _age(now: float, when: Any) -> float | None:
    try:
        return max(0.0, now - parse_iso(str(when)))
    except ValueError:
        return None


def job_samples(snap: JobSnapshot, now: float) -> list[Sample]:
    status: Mapping[str, Any] = snap.status
    engines: list[Mapping[str, Any]] = list(status.get("engines") or [])
    out: list[Sample] = []
    phase = status.get("phase")
    if phase:
        out += [("rljob_job_phase", (p.value,), 1.0 if p.value == phase else 0.0) for p in Phase]
    if phase == Phase.Failed.value:
        # Why, as a label: a job whose cells all spent their budget shows no cells once it is
        # Failed, so the budget alert needs the reason to outlive them.
        failed: Mapping[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "Failed"), {}
        )
        out.append(("rljob_job_failed", (str(failed.get("reason") or "Unknown"),), 1.0))
    states = [str(e.get("state", CellState.Pending.value)) for e in engines]
    out += [("rljob_cells", (s.value,), float(states.count(s.value))) for s in CellState]
    for key, metric in (("weightVersion", "rljob_weight_version"), ("rolloutId", "rljob_rollout_id")):
        value = _number(status.get(key))
        if value is not None:
            out.append((metric, (), value))
    for e in engines:
        cell = (str(e.get("name", "")),)
        used = int(e.get("restarts") or 0)
        out.append(("rljob_cell_restarts_used", cell, float(used)))
        if snap.max_restarts is not None:
            out.append(("rljob_cell_restarts_remaining", cell, float(max(0, snap.max_restarts - used))))
        age = _age(now, e.get("lastProbeTime")) if e.get("lastProbeTime") else None
        if age is not None:
            out.append(("rljob_cell_last_probe_age_seconds", cell, age))
        out.append(("rljob_cell_consecutive_probe_failures", cell, float(e.get("consecutiveFailures") or 0)))
    lock = status.get("lock") or {}
    held = _age(now, lock.get("since")) if lock.get("since") else None
    overdue = _age(now, lock.get("expires")) if lock.get("expires") else None
    out.append(("rljob_lock_held_seconds", (), held or 0.0))
    out.append(("rljob_lock_overdue_seconds", (), overdue or 0.0))
    return out
