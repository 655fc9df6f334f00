"""The InferenceController: owns the engine cells of one RLJob.

One asyncio object, driven two ways: the operator (or local mode) calls `run()` (level-based
reconcile + health probes on a timer), and the trainer calls the window/memory methods
through the controller API. Every public method takes `_mutex` for its decisions, so a
reconcile pass never interleaves with a window call; health probes run *outside* the mutex
(an engine may take `timeoutSeconds` to answer) and their answers are applied under it,
discarded when the health epoch or the cell's generation moved meanwhile.

Decisions worth knowing (see DESIGN.md "Engine cell lifecycle"):

- Cells are named `<job>-cell-<index>`; each recreation bumps `generation`, which the
  platform stamps on the pods, so retries and restarts never double a cell.
- A fresh cell ends in PendingWeights after its first successful probe and joins serving only
  after the next completed weight update. With `serve_initial_weights=True` (local mode, jobs
  that serve the model on disk) a generation-0 cell goes straight to Serving, but only while
  no weight update has ever completed and no window is open: a recreated or late cell would
  otherwise serve stale weights.
- While a window is open, disruptive steps (recreating unhealthy cells, deleting surplus
  cells) are deferred to the first pass after it closes; observing, creating missing cells
  and marking cells Unhealthy continue.
- `offload`, `onload` and `prepare_rollout` raise `LockHeld` while a window is open instead
  of waiting: their caller is normally the window's holder, for whom waiting is a deadlock.
- Aborting a window (by the caller, a failed weight check, or lock expiry) stops the
  participants whose generation has not changed: each is deleted and recreated at the next
  generation right away, *not* charged to the restart budget (the engine did nothing wrong;
  the caller's retry count bounds the loop, as in miles' 30 attempts). The lock is released
  even when stopping fails; reconcile retries the deletion.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller_runtime.api.spec import InferenceSpec, MemoryTag
from controller_runtime.api.status import CellState, EngineStatus, RLJobStatus
from controller_runtime.audit import AuditLog
from controller_runtime.cells import LOADED, UPDATABLE, Cell, cell_name
from controller_runtime.clock import Clock, RealClock, iso
from controller_runtime.deadline import call_within
from controller_runtime.errors import EngineError, LockHeld, WeightCheckMismatch
from controller_runtime.evalpin import NOT_CONFIGURED, UNHEALTHY, EvalFleet, pin_eval_clients
from controller_runtime.events import ControllerEvent, Reason
from controller_runtime.health import HealthMonitor, ProbeOutcome, Verdict
from controller_runtime.lock import ControllerLock, WindowLock, normalise_snapshot
from controller_runtime.ports import CellObservation, CellRequest, EngineClient, EngineClientFactory, Platform
from controller_runtime.restart import RestartBudget
from controller_runtime.weightcheck import changed_tensors, collect_checksums, compare_checksums
from controller_runtime.window import (
    NoReadyEngines,
    UpdateWindow,
    cells_to_serve,
    cells_to_stop,
    take_snapshot,
    window_engines,
)

log = logging.getLogger(__name__)

PAUSE_OFFLOAD = "offload"
PAUSE_WINDOW = "window"
S = CellState


@dataclass(frozen=True)
class MemoryChange:
    """What offload/onload did: tags per cell, and the cells whose engine refused."""

    cells: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"cells": self.cells, "failed": self.failed}


class InferenceController:
    def __init__(
        self,
        job: str,
        spec: InferenceSpec,
        platform: Platform,
        engines: EngineClientFactory,
        clock: Clock | None = None,
        audit: AuditLog | None = None,
        on_event: Callable[[ControllerEvent], None] | None = None,
        restore: RLJobStatus | None = None,
        *,
        serve_initial_weights: bool = False,
        poll_seconds: float = 10.0,
        call_timeout_seconds: float = 120.0,
        pass_timeout_seconds: float = 120.0,
        flush_retries: int = 60,
        flush_retry_seconds: float = 1.0,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.job = job
        self.spec = spec
        self.platform = platform
        self.engines = engines
        self.clock: Clock = clock or RealClock()
        self.audit = audit
        self.on_event = on_event
        self.serve_initial_weights = serve_initial_weights
        self.poll_seconds = poll_seconds
        self.call_timeout = call_timeout_seconds
        self.pass_timeout = pass_timeout_seconds
        self.flush_retries = flush_retries
        self.flush_retry_seconds = flush_retry_seconds
        self.labels = dict(labels or {})

        self.cells: dict[str, Cell] = {}  # the policy fleet: updated by windows, serves rollouts
        self.eval_cells: dict[str, Cell] = {}  # the frozen eval fleet (spec.inference.eval), pinned
        self.health = HealthMonitor(spec.health_check, self.clock)
        self.budget = RestartBudget(spec.restart_policy)
        self.lock = ControllerLock(spec.weight_update.lock_timeout_seconds)
        self.weight_version: str | None = None
        self.rollout_id: int | None = None
        self._mutex = asyncio.Lock()
        self._clients: dict[str, EngineClient] = {}
        self._serving_label: dict[str, bool] = {}  # last label the platform accepted
        self._deleted_generation: dict[str, int] = {}  # stale generation already deleted
        if restore is not None:
            self._restore(restore)

    # == restore and spec ===================================================================

    def _restore(self, status: RLJobStatus) -> None:
        """Rebuild from RLJob.status: cells, generations, budgets, the open window, the version."""
        now = self.clock.now()
        for es in status.engines:
            cell = Cell.from_status(es)
            if cell.created_time is None:
                cell.created_time = now
            group = self.eval_cells if cell.name.startswith(self._eval_prefix) else self.cells
            group[cell.name] = cell
            if cell.state == S.Starting or cell.state in LOADED:
                self.health.arm(cell.name)
        self.weight_version = status.weight_version
        self.rollout_id = status.rollout_id
        self.lock.restore(status.lock)
        if self.lock.held:
            self.health.pause(PAUSE_WINDOW)
        if any(c.memory for c in self.cells.values()):
            self.health.pause(PAUSE_OFFLOAD)

    def update_spec(self, spec: InferenceSpec) -> None:
        """Adopt a changed spec (replicas, health, budget, lock timeout); the next reconcile acts on it."""
        self.spec = spec
        self.health.spec = spec.health_check
        self.budget = RestartBudget(spec.restart_policy)
        self.lock.timeout_seconds = spec.weight_update.lock_timeout_seconds

    # == views ==============================================================================

    @property
    def _eval_prefix(self) -> str:
        return f"{self.job}-eval-"

    def _sorted_cells(self) -> list[Cell]:
        """The policy fleet, by index."""
        return sorted(self.cells.values(), key=lambda c: c.index)

    def _sorted_eval_cells(self) -> list[Cell]:
        return sorted(self.eval_cells.values(), key=lambda c: c.index)

    def _all_cells(self) -> list[Cell]:
        return self._sorted_cells() + self._sorted_eval_cells()

    def engine_statuses(self) -> list[EngineStatus]:
        """Policy cells, then eval cells (named `<job>-eval-<index>`)."""
        return [c.to_status() for c in self._all_cells()]

    def serving_endpoints(self) -> list[str]:
        return [c.endpoint for c in self._sorted_cells() if self._should_serve(c) and c.endpoint]

    def status_patch(self) -> dict[str, Any]:
        """The camelCase status fields the controller owns (`lock: None` clears a released lock)."""
        ready = sum(1 for c in self.cells.values() if c.state == S.Serving)
        total = self.spec.replicas
        return {
            "engines": [s.to_wire() for s in self.engine_statuses()],
            "lock": self.lock.current.to_status().to_wire() if self.lock.current else None,
            "weightVersion": self.weight_version,
            "rolloutId": self.rollout_id,
            "readyEngines": ready,
            "totalEngines": total,
            "ready": f"{ready}/{total}",
            "restartsTotal": sum(c.restarts for c in self._all_cells()),
        }

    # == events, audit, labels, clients =====================================================

    def _emit(self, reason: str, message: str, cell: str | None = None, warning: bool = False) -> None:
        event = ControllerEvent(reason, message, cell, warning)
        (log.warning if warning else log.info)("%s", event)
        self._audit_safe("event", cell, reason=reason, message=message, warning=warning)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event callback failed for %s", event)

    def _audit_safe(self, type: str, cell: str | None = None, **fields: Any) -> bool:
        if self.audit is None:
            return False
        try:
            self.audit.record(type, cell, **fields)
            return True
        except Exception:  # the audit log must never break the controller
            log.exception("audit record %s failed", type)
            return False

    def _move(self, cell: Cell, target: CellState, message: str = "", *, reason: str | None = None,
              warning: bool = False) -> bool:
        source = cell.state
        if not cell.transition(target, self.clock.now(), message):
            return False
        self._audit_safe("cell_transition", cell.name, generation=cell.generation, **{"from": str(source)},
                         to=str(target), message=message)
        default_reason = {
            S.Starting: Reason.CellStarting,
            S.PendingWeights: Reason.CellPendingWeights,
            S.Serving: Reason.CellServing,
            S.Unhealthy: Reason.CellUnhealthy,
            S.Failed: Reason.RestartBudgetExhausted,
            S.Offloaded: Reason.Offloaded,
        }.get(target)
        if reason or default_reason:
            text = f"{source} -> {target}" + (f": {message}" if message else "")
            self._emit(reason or default_reason or "", text, cell.name, warning or target in (S.Unhealthy, S.Failed))
        return True

    def _should_serve(self, cell: Cell) -> bool:
        """In the policy's serving set (eval cells never are: they serve evaluation only)."""
        return cell.name in self.cells and cell.state == S.Serving and not cell.memory

    async def _sync_serving(self, cell: Cell) -> None:
        """Make the platform's serving label match the cell; a failure is retried by the next pass."""
        want = self._should_serve(cell)
        if self._serving_label.get(cell.name) == want:
            return
        try:
            await call_within(self.clock, self.platform.set_serving(cell.name, want), self.call_timeout)
            self._serving_label[cell.name] = want
        except Exception as exc:
            self._serving_label.pop(cell.name, None)
            log.warning("set_serving(%s, %s) failed: %s", cell.name, want, exc)

    def _client(self, cell: Cell) -> EngineClient:
        assert cell.endpoint is not None
        client = self._clients.get(cell.endpoint)
        if client is None:
            client = self._clients[cell.endpoint] = self.engines(cell.endpoint)
        return client

    async def _drop_client(self, endpoint: str | None) -> None:
        client = self._clients.pop(endpoint, None) if endpoint else None
        if client is not None:
            try:
                await client.close()
            except Exception as exc:
                log.debug("closing client %s: %s", endpoint, exc)

    async def _engine_call(self, call: Any) -> Any:
        return await call_within(self.clock, call, self.call_timeout)

    # == reconcile ==========================================================================

    async def reconcile(self) -> float:
        """One level-based pass; returns seconds until it wants to run again."""
        async with self._mutex:
            await self._expire_lock_if_due()
            observed = {o.name: o for o in await self.platform.observe_cells()}
            now = self.clock.now()
            window_open = self.lock.held
            for index in range(self.spec.replicas):
                name = cell_name(self.job, index)
                if name not in self.cells:
                    self.cells[name] = Cell(name, index, created_time=now, last_transition_time=now)
            for index in range(self._eval_replicas):
                name = f"{self._eval_prefix}{index}"
                if name not in self.eval_cells:
                    self.eval_cells[name] = Cell(name, index, created_time=now, last_transition_time=now)
            await self._delete_surplus(observed, window_open)
            for cell in self._all_cells():
                await self._reconcile_cell(cell, observed.get(cell.name), window_open)
                await self._sync_serving(cell)
            return self._next_wakeup()

    @property
    def _eval_replicas(self) -> int:
        return self.spec.eval.replicas if self.spec.eval is not None else 0

    async def _delete_surplus(self, observed: dict[str, CellObservation], window_open: bool) -> None:
        """Cells beyond spec.replicas (and unknown cells the platform holds) are deleted, outside windows."""
        if window_open:
            return
        surplus = [c for c in self.cells.values() if c.index >= self.spec.replicas]
        surplus += [c for c in self.eval_cells.values() if c.index >= self._eval_replicas]
        strangers = [n for n in observed if n not in self.cells and n not in self.eval_cells]
        for name in [c.name for c in surplus] + strangers:
            await self.platform.delete_cell(name)
            cell = self.cells.pop(name, None) or self.eval_cells.pop(name, None)
            self.health.forget(name)
            self._serving_label.pop(name, None)
            self._deleted_generation.pop(name, None)
            if cell is not None:
                await self._drop_client(cell.endpoint)
                self._audit_safe("cell_deleted", name, generation=cell.generation)
                self._emit(Reason.CellDeleted, f"scaled down to {self.spec.replicas} cells"
                           f" ({self._eval_replicas} eval)", name)

    async def _create(self, cell: Cell) -> None:
        request = CellRequest(
            name=cell.name,
            index=cell.index,
            generation=cell.generation,
            pods=self.spec.pods_per_cell,
            labels={**self.labels, "rljob.io/job": self.job, "rljob.io/cell": cell.name,
                    "rljob.io/generation": str(cell.generation),
                    "rljob.io/role": "eval" if cell.name in self.eval_cells else "policy"},
        )
        self._serving_label.pop(cell.name, None)  # new pods: their label is unknown until set
        await self.platform.create_cell(request)
        if cell.created_time is None:
            cell.created_time = self.clock.now()

    async def _reconcile_cell(self, cell: Cell, obs: CellObservation | None, window_open: bool) -> None:
        if cell.state == S.Failed:
            if not self.budget.exhausted(cell.restarts) and not window_open:
                # The user raised maxRestarts: start the cell again (the new budget is charged on failure).
                cell.recreate(self.clock.now(), charge=False)
                self._emit(Reason.CellReplaced, "restart budget raised; recreating", cell.name)
            elif obs is not None and not window_open:
                await self.platform.delete_cell(cell.name)  # free the GPUs of a cell we gave up on
                return
            else:
                return
        if cell.state == S.Unhealthy:
            await self._heal(cell, obs, window_open)
            return
        if obs is not None and obs.generation > cell.generation:
            # Created by a controller that died before it recorded the new generation: adopt it.
            old_endpoint = cell.endpoint
            cell.adopt(obs.generation, self.clock.now())
            self.health.forget(cell.name)
            await self._drop_client(old_endpoint)
        if obs is None or obs.generation < cell.generation:
            if obs is not None and self._deleted_generation.get(cell.name) != obs.generation:
                await self.platform.delete_cell(cell.name)  # stale pods of an older generation
                self._deleted_generation[cell.name] = obs.generation
            if cell.state == S.Pending:
                await self._create(cell)
                if self.health.startup_expired(cell):
                    self._mark_unhealthy(cell, "no pods running before the startup deadline",
                                         reason=Reason.StartupDeadlineExceeded)
            else:
                self._mark_unhealthy(cell, "the cell's pods are gone")
            return
        # obs.generation == cell.generation
        self._deleted_generation.pop(cell.name, None)
        cell.pods = tuple(p.name for p in obs.pods)
        if obs.endpoint and obs.endpoint != cell.endpoint:
            await self._drop_client(cell.endpoint)
            cell.endpoint = obs.endpoint
        if obs.any_failed or obs.restarts > cell.pod_restarts:
            dead = [f"{p.name} {p.phase} (restarts {p.restarts})" for p in obs.pods
                    if p.phase in ("Failed", "Succeeded", "Unknown") or p.restarts]
            cell.pod_restarts = obs.restarts
            self._mark_unhealthy(cell, "pod failed or restarted: " + ", ".join(dead))
            return
        cell.pod_restarts = obs.restarts
        if cell.state == S.Pending and obs.all_running and cell.endpoint:
            self._move(cell, S.Starting, "pods running; waiting for the engine to answer")
            self.health.arm(cell.name)
        if self.health.startup_expired(cell):
            deadline = self.spec.health_check.startup_deadline_seconds
            self._mark_unhealthy(cell, f"not serving within {deadline:g} s", reason=Reason.StartupDeadlineExceeded)

    def _mark_unhealthy(self, cell: Cell, message: str, *, reason: str = Reason.CellUnhealthy) -> None:
        if cell.state in (S.Unhealthy, S.Failed):
            return
        self._move(cell, S.Unhealthy, message, reason=reason, warning=True)
        self.health.forget(cell.name)

    async def _heal(self, cell: Cell, obs: CellObservation | None, window_open: bool) -> None:
        """Unhealthy: stop its pods, then recreate after the backoff, within the budget."""
        now = self.clock.now()
        if cell.next_restart_time is None:
            # The backoff runs from the moment the cell became Unhealthy.
            due = self.budget.next_restart_time(cell.restarts, cell.last_transition_time or now)
            if due is None:
                self._move(cell, S.Failed,
                           f"restart budget of {self.spec.restart_policy.max_restarts} spent; last: {cell.message}",
                           reason=Reason.RestartBudgetExhausted, warning=True)
                self._audit_safe("restart_budget_exhausted", cell.name, restarts=cell.restarts)
                if obs is not None and not window_open:
                    await self.platform.delete_cell(cell.name)
                return
            cell.next_restart_time = due
            self._audit_safe("restart_scheduled", cell.name, at=iso(due), restarts=cell.restarts)
        if window_open:
            return  # deferred, not lost: next_restart_time stays and the first pass after the window acts
        if obs is not None and self._deleted_generation.get(cell.name) != obs.generation:
            await self.platform.delete_cell(cell.name)
            self._deleted_generation[cell.name] = obs.generation
        if now < cell.next_restart_time:
            return
        old_endpoint, old_generation = cell.endpoint, cell.generation
        cell.recreate(now, charge=True)
        await self._drop_client(old_endpoint)
        self.health.forget(cell.name)
        self._audit_safe("cell_replaced", cell.name, generation=cell.generation, restarts=cell.restarts)
        self._emit(Reason.CellReplaced,
                   f"generation {old_generation} -> {cell.generation} (restart {cell.restarts} of "
                   f"{self.spec.restart_policy.max_restarts})", cell.name)
        await self._create(cell)

    def _next_wakeup(self) -> float:
        now = self.clock.now()
        waits = [self.poll_seconds]
        if self.lock.current is not None:
            waits.append(self.lock.current.expires - now)
        for cell in self._all_cells():
            if cell.state == S.Unhealthy and cell.next_restart_time is not None:
                waits.append(cell.next_restart_time - now)
            elif cell.state in (S.Pending, S.Starting):
                waits.append(1.0)
                if cell.created_time is not None:
                    waits.append(cell.created_time + self.spec.health_check.startup_deadline_seconds - now)
            if self.health.wants_probe(cell):
                waits.append(self.health.seconds_until_due(cell.name))
        return max(0.0, min(waits))

    # == health =============================================================================

    async def probe_health(self) -> None:
        """Run every due probe concurrently (each bounded by timeoutSeconds) and apply the answers."""
        async with self._mutex:
            due = [(c, self._client(c)) for c in self._all_cells()
                   if self.health.wants_probe(c) and self.health.is_due(c.name)]
            probes = [self.health.probe(c, client) for c, client in due]
        outcomes: list[ProbeOutcome] = list(await asyncio.gather(*probes)) if probes else []
        if not outcomes:
            return
        async with self._mutex:
            for outcome in outcomes:
                cell = self.cells.get(outcome.cell) or self.eval_cells.get(outcome.cell)
                if cell is not None and cell.state in (S.Starting, S.PendingWeights, S.Serving):
                    self._apply_probe(cell, outcome)
            for cell in self._all_cells():
                await self._sync_serving(cell)

    def _apply_probe(self, cell: Cell, outcome: ProbeOutcome) -> None:
        verdict = self.health.record(cell, outcome)
        if verdict == Verdict.healthy and cell.state == S.Starting:
            if self._may_serve_initial_weights(cell):
                cell.weight_version = self.weight_version
                self._move(cell, S.Serving, "engine answered; serving the initial weights")
            else:
                wait_for = "pinning" if cell.name in self.eval_cells else "the next weight update"
                self._move(cell, S.PendingWeights, f"engine answered; waiting for {wait_for}")
        elif verdict == Verdict.unhealthy:
            self._mark_unhealthy(
                cell, f"{cell.consecutive_failures} consecutive failed probes; last: {outcome.error}")

    def _may_serve_initial_weights(self, cell: Cell) -> bool:
        return (self.serve_initial_weights and cell.name in self.cells and cell.generation == 0
                and self.weight_version is None and not self.lock.held)

    # == run loop ===========================================================================

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile and probe until `stop` is set; each pass is bounded, errors are logged."""
        while not stop.is_set():
            delay = self.poll_seconds
            try:
                delay = await call_within(self.clock, self.reconcile(), self.pass_timeout)
            except Exception:
                log.exception("reconcile of %s failed", self.job)
            try:
                await call_within(self.clock, self.probe_health(), self.pass_timeout)
            except Exception:
                log.exception("health probes of %s failed", self.job)
            await self._wait(stop, min(delay, self._next_wakeup()))

    async def _wait(self, stop: asyncio.Event, seconds: float) -> None:
        stopper = asyncio.ensure_future(stop.wait())
        timer = asyncio.ensure_future(self.clock.sleep(max(seconds, 0.05)))
        try:
            await asyncio.wait({stopper, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            timer.cancel()

    async def close(self) -> None:
        async with self._mutex:
            for endpoint in list(self._clients):
                await self._drop_client(endpoint)

    # == rollout, offload, onload ===========================================================

    def _refuse_in_window(self, what: str) -> None:
        if self.lock.current is not None:
            raise LockHeld(f"{what} is refused while the update window of {self.lock.current.holder!r} is open")

    async def prepare_rollout(self, rollout_id: int) -> None:
        async with self._mutex:
            await self._expire_lock_if_due()
            self._refuse_in_window("prepare_rollout")
            self.rollout_id = rollout_id
            self.health.resume(PAUSE_OFFLOAD)
            self._audit_safe("rollout_prepared", rollout_id=rollout_id)
            self._emit(Reason.RolloutPrepared, f"rollout {rollout_id}; health monitoring active")

    async def offload(self, tags: Sequence[MemoryTag | str] | None = None) -> MemoryChange:
        """Release engine memory (default: spec.offload.tags) of every PendingWeights/Serving cell."""
        wanted = _tags(tags if tags is not None else self.spec.offload.tags)
        async with self._mutex:
            await self._expire_lock_if_due()
            self._refuse_in_window("offload")
            self.health.pause(PAUSE_OFFLOAD)
            targets = [c for c in self._sorted_cells()
                       if c.endpoint and (c.state in UPDATABLE or c.state == S.Offloaded)
                       and any(t not in c.memory for t in wanted)]
            results = await asyncio.gather(*(self._offload_cell(c, wanted) for c in targets),
                                           return_exceptions=True)
            change = self._memory_change(targets, results)
            for cell in targets:
                await self._sync_serving(cell)
            self._audit_safe("offload", tags=[str(t) for t in wanted], **change.to_dict())
            self._emit(Reason.Offloaded, f"released {', '.join(map(str, wanted))} on {len(change.cells)} cells"
                       + (f"; failed on {sorted(change.failed)}" if change.failed else ""),
                       warning=bool(change.failed))
            return change

    async def _offload_cell(self, cell: Cell, tags: list[MemoryTag]) -> list[str]:
        client = self._client(cell)
        release = [t for t in tags if t not in cell.memory]
        for attempt in range(self.flush_retries):
            try:
                await self._engine_call(client.flush_cache())
                break
            except EngineError as exc:
                if attempt + 1 >= self.flush_retries:
                    raise
                log.info("flush_cache on %s: %s; retrying", cell.name, exc)
                await self.clock.sleep(self.flush_retry_seconds)
        await self._engine_call(client.release_memory(release))
        cell.memory = tuple(t for t in MemoryTag if t in cell.memory or t in release)
        if MemoryTag.weights in release and cell.state != S.Offloaded:
            cell.state_before_offload = cell.state
            self._move(cell, S.Offloaded, "weights released")
        return [str(t) for t in release]

    async def onload(self, tags: Sequence[MemoryTag | str] | None = None) -> MemoryChange:
        """Take memory back; when the weights are back, the cell returns to its state before offload."""
        wanted = _tags(tags if tags is not None else list(MemoryTag))
        async with self._mutex:
            await self._expire_lock_if_due()
            self._refuse_in_window("onload")
            targets = [c for c in self._sorted_cells() if c.endpoint and any(t in c.memory for t in wanted)]
            results = await asyncio.gather(*(self._onload_cell(c, wanted) for c in targets),
                                           return_exceptions=True)
            change = self._memory_change(targets, results)
            for cell in targets:
                await self._sync_serving(cell)
            if not any(c.memory for c in self.cells.values()):
                self.health.resume(PAUSE_OFFLOAD)
            self._audit_safe("onload", tags=[str(t) for t in wanted], **change.to_dict())
            self._emit(Reason.Onloaded, f"resumed {', '.join(map(str, wanted))} on {len(change.cells)} cells"
                       + (f"; failed on {sorted(change.failed)}" if change.failed else ""),
                       warning=bool(change.failed))
            return change

    async def _onload_cell(self, cell: Cell, tags: list[MemoryTag]) -> list[str]:
        resume = [t for t in tags if t in cell.memory]
        await self._engine_call(self._client(cell).resume_memory(resume))
        cell.memory = tuple(t for t in cell.memory if t not in resume)
        if cell.state == S.Offloaded and MemoryTag.weights not in cell.memory:
            back = cell.state_before_offload or S.PendingWeights
            cell.state_before_offload = None
            if back == S.Serving and cell.weight_version != self.weight_version:
                # It slept through a weight update: serving again would serve stale weights.
                self._move(cell, S.PendingWeights,
                           f"weights onloaded at {cell.weight_version}, fleet is at {self.weight_version}")
            else:
                self._move(cell, back, "weights onloaded")
        return [str(t) for t in resume]

    def _memory_change(self, cells: list[Cell], results: Iterable[object]) -> MemoryChange:
        change = MemoryChange()
        for cell, result in zip(cells, results, strict=True):
            if isinstance(result, BaseException):
                change.failed[cell.name] = f"{type(result).__name__}: {result}"
            else:
                change.cells[cell.name] = list(result)  # type: ignore[call-overload]
        return change

    # == the eval fleet ======================================================================

    async def eval_fleet(self) -> EvalFleet:
        """Pin the eval fleet to spec.inference.eval's checkpoint and say whether eval may run.

        Loads the checkpoint on eval cells not yet pinned (outside the mutex: a load can take
        minutes), verifies every eval engine reports the version, probes readiness, and marks
        the cells Serving at that version. Plain data out; skip reasons instead of exceptions.
        """
        pin = self.spec.eval
        if pin is None:
            return EvalFleet([], None, "", False, NOT_CONFIGURED, "spec.inference.eval is not set")
        async with self._mutex:
            cells = self._sorted_eval_cells()
            ready = [c for c in cells if c.state in UPDATABLE and c.endpoint]
            if len(ready) < pin.replicas:
                return EvalFleet(
                    [c.endpoint for c in ready if c.endpoint], pin.weight_version, pin.checkpoint, False, UNHEALTHY,
                    f"{len(ready)}/{pin.replicas} eval cells ready: "
                    + ", ".join(f"{c.name}={c.state}" for c in cells),
                )
            generations = {c.name: c.generation for c in ready}
            clients = [self._client(c) for c in ready]
            pinned = {c.endpoint for c in ready if c.state == S.Serving and c.weight_version == pin.weight_version}
        fleet = await pin_eval_clients(clients, pin.checkpoint, pin.weight_version, skip_load=pinned,
                                       clock=self.clock, load_timeout=self.call_timeout * 5,
                                       probe_timeout=self.spec.health_check.timeout_seconds)
        async with self._mutex:
            if fleet.ok:
                for name, generation in generations.items():
                    cell = self.eval_cells.get(name)
                    if cell is not None and cell.generation == generation and cell.state in UPDATABLE:
                        cell.weight_version = pin.weight_version
                        self._move(cell, S.Serving, f"pinned to {pin.checkpoint} ({pin.weight_version})")
            self._audit_safe("eval_pinned", ok=fleet.ok, skip_reason=fleet.skip_reason, message=fleet.message,
                             version=pin.weight_version, checkpoint=pin.checkpoint)
            if not fleet.ok:
                self._emit(Reason.EvalSkipped, f"{fleet.skip_reason}: {fleet.message}", warning=True)
        return fleet

    # == the weight-update window ===========================================================

    async def start_update_weights(self, holder: str, ready_timeout: float | None = None) -> UpdateWindow:
        """Take the lock; answer the participants (PendingWeights/Serving cells) sorted by index.

        With `ready_timeout`, first wait (without holding anything) up to that long until every
        cell that is not Failed can take weights, as miles does for a fresh fleet; `run()` must
        be driving the cells meanwhile.
        """
        if ready_timeout is not None:
            await self._wait_until_ready(ready_timeout)
        async with self._mutex:
            await self._expire_lock_if_due()
            if self.lock.current is not None:
                raise LockHeld(f"the update window is held by {self.lock.current.holder!r} "
                               f"until {iso(self.lock.current.expires)}")
            snapshot = take_snapshot(self.cells.values())
            if not snapshot:
                raise NoReadyEngines("no engine cell is PendingWeights or Serving: "
                                     + ", ".join(f"{c.name}={c.state}" for c in self._sorted_cells()))
            now = self.clock.now()
            lock = self.lock.acquire(holder, snapshot, now)
            self.health.pause(PAUSE_WINDOW)
            if self.spec.weight_update.check_weights:
                try:
                    lock.checksums = await collect_checksums(self._participant_clients(lock), self.clock,
                                                             self.call_timeout)
                except Exception:
                    self.lock.release()
                    self.health.resume(PAUSE_WINDOW)
                    raise
            engines = window_engines(self.cells.values(), snapshot, self.spec.gpus_per_engine)
            self._audit_safe("window_opened", holder=holder, snapshot=snapshot, expires=iso(lock.expires))
            self._emit(Reason.WindowOpened, f"{holder} opened an update window over {len(engines)} cells")
            return UpdateWindow(engines=engines, snapshot=dict(snapshot), lock=lock.to_status())

    async def _wait_until_ready(self, seconds: float) -> None:
        deadline = self.clock.now() + seconds
        while self.clock.now() < deadline:
            live = [c for c in self.cells.values() if c.state != S.Failed]
            if live and len(self.cells) >= self.spec.replicas and all(c.state in UPDATABLE for c in live):
                return
            await self.clock.sleep(min(2.0, max(0.0, deadline - self.clock.now())))

    def _participant_clients(self, lock: WindowLock) -> dict[str, EngineClient]:
        return {c.name: self._client(c) for c in cells_to_serve(self.cells.values(), lock.snapshot) if c.endpoint}

    async def end_update_weights(
        self,
        snapshot: dict[str, int],
        weight_version: str | None = None,
        expected_checksums: dict[str, str] | None = None,
    ) -> list[str]:
        """Close the window: participants still in the snapshot become Serving at `weight_version`.

        Without `weight_version` the version is the previous one plus one (numeric versions).
        With spec.inference.weightUpdate.checkWeights, disagreeing participants fail the window:
        it is aborted (participants stopped, lock released) and WeightCheckMismatch is raised.
        """
        async with self._mutex:
            await self._expire_lock_if_due()  # a window past its expiry cannot be ended any more
            lock = self.lock.check(snapshot)
            version = weight_version if weight_version is not None else _next_version(self.weight_version)
            if self.spec.weight_update.check_weights:
                await self._check_weights(lock, expected_checksums)
            served = cells_to_serve(self.cells.values(), lock.snapshot)
            for cell in served:
                cell.weight_version = version
                self._move(cell, S.Serving, f"weights {version}")
            self.weight_version = version
            self.lock.release()
            self.health.resume(PAUSE_WINDOW)
            for cell in served:
                await self._sync_serving(cell)
            took = self.clock.now() - lock.since
            self._audit_safe("weights_updated", version=version, cells=[c.name for c in served],
                             seconds=round(took, 3), holder=lock.holder)
            self._emit(Reason.WeightsUpdated, f"weights updated to v{version} in {took:.1f} s "
                       f"({len(served)} cells serving)")
            return [c.name for c in served]

    async def _check_weights(self, lock: WindowLock, expected: dict[str, str] | None) -> None:
        clients = self._participant_clients(lock)
        try:
            after = await collect_checksums(clients, self.clock, self.call_timeout)
            mismatched = compare_checksums(after, expected)
        except Exception as exc:
            after, mismatched = {}, {name: [f"<unreadable: {type(exc).__name__}: {exc}>"] for name in clients}
        self._audit_safe("weight_check", ok=not mismatched, mismatched=mismatched,
                         changed=changed_tensors(lock.checksums or {}, after))
        if mismatched:
            await self._abort_locked(lock, "weight check failed")
            self._emit(Reason.WeightCheckFailed, str(WeightCheckMismatch(mismatched)), warning=True)
            raise WeightCheckMismatch(mismatched)

    async def abort_update_weights(self, snapshot: dict[str, int]) -> list[str]:
        """Stop every participant whose generation has not changed; always release the lock."""
        async with self._mutex:
            expired = await self._expire_lock_if_due()
            if expired is not None and expired[0].snapshot == normalise_snapshot(snapshot):
                return expired[1]  # already aborted by its expiry: the same answer
            lock = self.lock.check(snapshot)
            return await self._abort_locked(lock, f"update window of {lock.holder!r} aborted")

    async def _abort_locked(self, lock: WindowLock, why: str, *, reason: str = Reason.WindowAborted) -> list[str]:
        stopped: list[str] = []
        failures: list[str] = []
        try:
            for cell in cells_to_stop(self.cells.values(), lock.snapshot):
                self._move(cell, S.Unhealthy, f"stopped: {why}", reason=reason, warning=True)
                old_generation, old_endpoint = cell.generation, cell.endpoint
                try:
                    await call_within(self.clock, self.platform.delete_cell(cell.name), self.call_timeout)
                    self._deleted_generation[cell.name] = old_generation
                except Exception as exc:  # reconcile deletes the stale generation later
                    failures.append(f"{cell.name}: {type(exc).__name__}: {exc}")
                cell.recreate(self.clock.now(), charge=False)
                self.health.forget(cell.name)
                await self._drop_client(old_endpoint)
                stopped.append(cell.name)
        finally:
            self.lock.release()
            self.health.resume(PAUSE_WINDOW)
        self._audit_safe("window_aborted", holder=lock.holder, why=why, stopped=stopped, failures=failures)
        self._emit(reason, f"{why}: stopped {stopped or 'no cells'}"
                   + (f"; stopping failed for {failures} (retried by reconcile)" if failures else ""),
                   warning=True)
        return stopped

    async def _expire_lock_if_due(self) -> tuple[WindowLock, list[str]] | None:
        """Abort the open window if it is past its expiry; returns it and the cells stopped."""
        lock = self.lock.expired(self.clock.now())
        if lock is None:
            return None
        self._emit(Reason.LockExpired, f"update window of {lock.holder!r} open since {iso(lock.since)} "
                   f"expired at {iso(lock.expires)}; aborting it", warning=True)
        self._audit_safe("lock_expired", holder=lock.holder, since=iso(lock.since), expires=iso(lock.expires))
        return lock, await self._abort_locked(lock, f"lock of {lock.holder!r} expired")


def _tags(tags: Iterable[MemoryTag | str]) -> list[MemoryTag]:
    """Validated, de-duplicated, in canonical order."""
    wanted = {MemoryTag(t) for t in tags}
    return [t for t in MemoryTag if t in wanted]


def _next_version(current: str | None) -> str:
    if current is None:
        return "1"
    if current.isdigit():
        return str(int(current) + 1)
    raise ValueError(f"weight version {current!r} is not numeric: pass weight_version explicitly")
