"""The InferenceController: owns the engine cells of one RLJob.

One asyncio object, driven two ways: the operator (or local mode) calls `run_pass()` on a
timer, or `run()` which loops over it (level-based reconcile + health probes, each pass
bounded), and the trainer calls the window/memory methods through the controller API. Every
public method takes the fleet's mutex for its decisions, so a reconcile pass never
interleaves with a window call; health probes run *outside* the mutex (an engine may take
`timeoutSeconds` to answer) and their answers are applied under it, discarded when the
health epoch or the cell's generation moved meanwhile.

The cells, their engine clients and their state moves live in one `fleet.Fleet`; this class
holds the cell lifecycle (reconcile, healing, probes) and the weight-update window, and hands
memory to `memory.FleetMemory` and eval pinning to `evalfleet.EvalCells`, both over the same
fleet.

Decisions worth knowing (see docs/design.md "The engine cell state machine"):

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
- `offload` and `onload` raise `LockHeld` while a window is open instead of waiting: their
  caller is normally the window's holder, for whom waiting is a deadlock. `prepare_rollout`
  waits for the window to close (bounded, then `LockHeld` naming the holder), as miles' V2
  does: its caller may be another trainer rank or tool while the writer pushes weights.
- Aborting a window (by the caller, a failed weight check, or lock expiry) stops the
  participants whose generation has not changed: each is deleted and recreated at the next
  generation right away, *not* charged to the restart budget (the engine did nothing wrong;
  the caller's retry count bounds the loop, as in miles' 30 attempts). The lock is released
  even when stopping fails; reconcile retries the deletion.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from controller_runtime.api.control import PREPARE_WAIT_SECONDS, RecordEvalRequest
from controller_runtime.api.spec import InferenceSpec, MemoryTag
from controller_runtime.api.status import CellState, EngineStatus, EvalStatus, RLJobStatus
from controller_runtime.audit import AuditWriter
from controller_runtime.cells import LOADED, UPDATABLE, Cell
from controller_runtime.clock import Clock, RealClock, iso, sleep_or_stop
from controller_runtime.deadline import call_within
from controller_runtime.errors import EngineUnavailable, LockHeld, NoReadyEngines, WeightCheckMismatch
from controller_runtime.evalfleet import EvalCells, eval_replicas
from controller_runtime.evalpin import EvalFleet
from controller_runtime.events import ControllerEvent, Reason
from controller_runtime.fleet import Fleet
from controller_runtime.health import STARTING_PROBE_SECONDS, HealthMonitor, ProbeOutcome, Verdict
from controller_runtime.lock import ClosedWindow, ControllerLock, WindowLock
from controller_runtime.memory import PAUSE_OFFLOAD, FleetMemory, MemoryChange, memory_tags
from controller_runtime.ports import (
    CellObservation,
    CellRequest,
    CellRole,
    EngineClient,
    EngineClientFactory,
    Platform,
)
from controller_runtime.restart import RestartBudget
from controller_runtime.weightcheck import changed_tensors, collect_checksums, compare_checksums
from controller_runtime.window import (
    UpdateWindow,
    cells_to_serve,
    cells_to_stop,
    dead_at_abort,
    take_snapshot,
    window_engines,
)

__all__ = ["PAUSE_OFFLOAD", "PAUSE_WINDOW", "InferenceController", "MemoryChange"]

log = logging.getLogger(__name__)

ABORT_EVIDENCE_SECONDS = 5.0  # how long an abort looks for proof that a participant died

PAUSE_WINDOW = "window"  # the health monitor's pause reason while an update window is open
MIN_WAIT_SECONDS = 0.05  # between passes of `run`: a pass that wants to run again at once still yields
LOCK_POLL_SECONDS = 0.1  # how often a waiting prepare_rollout looks whether the window closed
READY_POLL_SECONDS = 0.25  # how often a window waiting for starting cells looks again (in-memory state only)
# How long a pass waits for the probes it started: answers that come in time go out with the
# pass's status write; a slow or hung engine's answer is applied when it comes, without the pass.
PASS_PROBE_WAIT_SECONDS = 0.5
S = CellState



@dataclass(frozen=True)
class PassReport:
    """What one bounded pass saw: seconds until it wants to run again, and what failed
    (already logged; empty when the pass went through)."""

    delay: float
    failures: tuple[str, ...] = ()

class InferenceController:
    def __init__(
        self,
        job: str,
        spec: InferenceSpec,
        platform: Platform,
        engines: EngineClientFactory,
        clock: Clock | None = None,
        audit: AuditWriter | None = None,
        on_event: Callable[[ControllerEvent], None] | None = None,
        restore: RLJobStatus | None = None,
        *,
        serve_initial_weights: bool = False,
        poll_seconds: float = 10.0,
        probes_wake_passes: bool = True,
        pods_wake_passes: bool = False,
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
        self.serve_initial_weights = serve_initial_weights
        self.poll_seconds = poll_seconds
        # False: a pass's delay leaves out when probes fall due, and the driver starts them on
        # time itself (`seconds_until_probe`, `probe_health`) without a whole pass (the operator).
        self.probes_wake_passes = probes_wake_passes
        # True: the driver runs a pass when a pod of a cell that waits for its pods changes (the
        # operator's pod watch), so a Pending or Starting cell is not looked at again every
        # STARTING_PROBE_SECONDS: with many jobs whose cells wait minutes for their pods, that
        # poll would flood the operator's one event loop with passes.
        self.pods_wake_passes = pods_wake_passes
        self.call_timeout = call_timeout_seconds
        self.pass_timeout = pass_timeout_seconds
        self.labels = dict(labels or {})  # extra labels for the platform to put on every cell

        self.fleet = Fleet(job, platform, engines, self.clock, audit=audit, on_event=on_event,
                           call_timeout=call_timeout_seconds)
        self.health = HealthMonitor(spec.health_check, self.clock)
        self.budget = RestartBudget(spec.restart_policy)
        self.lock = ControllerLock(spec.weight_update.lock_timeout_seconds)
        self.memory = FleetMemory(self.fleet, self.health, flush_retries=flush_retries,
                                  flush_retry_seconds=flush_retry_seconds)
        self.eval = EvalCells(self.fleet)
        self.rollout_id: int | None = None
        self._deleted_generation: dict[str, int] = {}  # stale generation already deleted
        # A create that raised may still have made pods (a timeout after the API server took it),
        # with a label the cell may no longer want: that generation's label is then never assumed.
        self._create_raised: dict[str, int] = {}
        self._probing: dict[str, asyncio.Task[None]] = {}  # cells whose probe is out, each on its own
        self._probe_deadline: dict[str, float] = {}  # when that probe has timed out at the latest
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
            self.fleet.add(cell)
            if cell.state is S.Starting or cell.state in LOADED:
                self.health.arm(cell.name)
        self.fleet.weight_version = status.weight_version
        self.rollout_id = status.rollout_id
        self.eval.last = status.last_eval
        self.lock.restore(status.lock, now)
        if self.lock.held:
            self.health.pause(PAUSE_WINDOW)
        if self.memory.any_released():
            self.health.pause(PAUSE_OFFLOAD)

    def update_spec(self, spec: InferenceSpec) -> None:
        """Adopt a changed spec (replicas, health, budget, lock timeout); the next reconcile acts on it."""
        self.spec = spec
        self.health.spec = spec.health_check
        self.budget = RestartBudget(spec.restart_policy)
        self.lock.timeout_seconds = spec.weight_update.lock_timeout_seconds

    # == views ==============================================================================

    def engine_statuses(self) -> list[EngineStatus]:
        """Policy cells, then eval cells (named `<job>-eval-<index>`)."""
        return [c.to_status() for c in self.fleet.all()]

    def serving_endpoints(self) -> list[str]:
        return self.fleet.serving_endpoints()

    def status_patch(self) -> dict[str, Any]:
        """The camelCase status fields the controller owns (`lock: None` clears a released lock)."""
        ready = sum(1 for c in self.fleet.cells.values() if c.state is S.Serving)
        total = self.spec.replicas
        return {
            "engines": [s.to_wire() for s in self.engine_statuses()],
            "lock": self.lock.current.to_status().to_wire() if self.lock.current else None,
            "weightVersion": self.fleet.weight_version,
            "rolloutId": self.rollout_id,
            "readyEngines": ready,
            "totalEngines": total,
            "ready": f"{ready}/{total}",
            "restartsTotal": sum(c.restarts for c in self.fleet.all()),
            "lastEval": self.eval.last.to_wire() if self.eval.last else None,
        }

    # == reconcile ==========================================================================

    async def reconcile(self) -> float:
        """One level-based pass; returns seconds until it wants to run again."""
        async with self.fleet.mutex:
            await self._expire_lock_if_due()
            observed = {o.name: o for o in await self.platform.observe_cells()}
            now = self.clock.now()
            window_open = self.lock.held
            self.fleet.ensure_cells(CellRole.policy, self.spec.replicas, now)
            self.fleet.ensure_cells(CellRole.eval, eval_replicas(self.spec), now)
            await self._delete_surplus(observed, window_open)
            # Cells are independent: their platform calls go out together, so replacing five
            # cells costs the API round trips of one, not five in a row.
            results = await asyncio.gather(
                *(self._reconcile_and_sync(cell, observed.get(cell.name), window_open) for cell in self.fleet.all()),
                return_exceptions=True,
            )
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
            return self._next_wakeup()

    async def _reconcile_and_sync(self, cell: Cell, obs: CellObservation | None, window_open: bool) -> None:
        was_unhealthy = cell.state is S.Unhealthy
        await self._reconcile_cell(cell, obs, window_open)
        if not was_unhealthy and cell.state is S.Unhealthy:
            # Found dead in this pass: stop it now, and recreate it now when no backoff is due,
            # rather than one pass later.
            await self._heal(cell, obs, window_open)
        await self.fleet.sync_serving(cell)

    async def _delete_surplus(self, observed: dict[str, CellObservation], window_open: bool) -> None:
        """Cells beyond spec.replicas (and unknown cells the platform holds) are deleted, outside windows."""
        if window_open:
            return
        evals = eval_replicas(self.spec)
        surplus = self.fleet.surplus(CellRole.policy, self.spec.replicas) + self.fleet.surplus(CellRole.eval, evals)
        strangers = [n for n in observed if not self.fleet.known(n)]
        for name in [c.name for c in surplus] + strangers:
            await self.platform.delete_cell(name)
            cell = self.fleet.remove(name)
            self.health.forget(name)
            self._deleted_generation.pop(name, None)
            self._create_raised.pop(name, None)
            if cell is not None:
                await self.fleet.drop_client(cell.endpoint)
                self.fleet.record("cell_deleted", name, generation=cell.generation)
                self.fleet.emit(Reason.CellDeleted, f"scaled down to {self.spec.replicas} cells ({evals} eval)", name)

    async def _create(self, cell: Cell, *, whole: bool = True) -> None:
        """Create the cell's pods: all of them (`whole`), or those a refused create left missing.

        A cell that will serve the weights it starts with is created serving where the platform
        admits it only once its engine answers: no label write when it comes up. The pods of a
        partial create, or of any create after one that raised, may join ones made earlier whose
        label is another (a window opened in between): the label is then unknown and the next
        sync writes what the cell wants."""
        admit = self.platform.admits_when_ready and self._may_serve_initial_weights(cell)
        request = CellRequest(name=cell.name, index=cell.index, generation=cell.generation, labels=dict(self.labels),
                              role=self.fleet.role_of(cell.name), serving=admit)
        self.fleet.label_unknown(cell.name)
        if cell.created_time is None:  # the first attempt: a refused create still runs the deadlines
            cell.created_time = self.clock.now()
        try:
            await self.platform.create_cell(request)
        except BaseException:
            self._create_raised[cell.name] = cell.generation
            raise
        if whole and self._create_raised.pop(cell.name, None) != cell.generation:
            self.fleet.label_created(cell.name, admit)

    async def _reconcile_cell(self, cell: Cell, obs: CellObservation | None, window_open: bool) -> None:
        if cell.state is S.Failed:
            if not self.budget.exhausted(cell.restarts) and not window_open:
                # The user raised maxRestarts: start the cell again (the new budget is charged on failure).
                cell.recreate(self.clock.now(), charge=False)
                self.fleet.emit(Reason.CellReplaced, "restart budget raised; recreating", cell.name)
            elif obs is not None and not window_open:
                await self.platform.delete_cell(cell.name)  # free the GPUs of a cell we gave up on
                return
            else:
                return
        if cell.state is S.Unhealthy:
            await self._heal(cell, obs, window_open)
            return
        if obs is not None and obs.generation > cell.generation:
            # Created by a controller that died before it recorded the new generation: adopt it.
            old_endpoint = cell.endpoint
            cell.adopt(obs.generation, self.clock.now())
            self.health.forget(cell.name)
            await self.fleet.drop_client(old_endpoint)
        if obs is None or obs.generation < cell.generation:
            if obs is not None and self._deleted_generation.get(cell.name) != obs.generation:
                await self.platform.delete_cell(cell.name)  # stale pods of an older generation
                self._deleted_generation[cell.name] = obs.generation
            if cell.state is S.Pending:
                # Checked first: a create the API server keeps refusing (a quota) raises every
                # pass, and the deadline must still end it (it runs from the first attempt).
                if self.health.startup_expired(cell):
                    self._mark_unhealthy(cell, "no pods running before the startup deadline",
                                         reason=Reason.StartupDeadlineExceeded)
                    return
                await self._create(cell)
            else:
                self._mark_unhealthy(cell, "the cell's pods are gone")
            return
        # obs.generation == cell.generation
        self._deleted_generation.pop(cell.name, None)
        cell.pods = tuple(p.name for p in obs.pods)
        if obs.endpoint and obs.endpoint != cell.endpoint:
            await self.fleet.drop_client(cell.endpoint)
            cell.endpoint = obs.endpoint
        if cell.state is S.Pending and obs.incomplete:
            # Pods of the cell were never made (the API server refused a create: a brand-new
            # namespace without its ServiceAccount yet, a quota) or went before the engine was
            # probed: make what is missing, as a ReplicaSet would, and as a cell with no pods at
            # all is made again above. No engine answered yet, so nothing is lost and no
            # restart is charged; the startup deadline still bounds it.
            if self.health.startup_expired(cell):
                deadline = self.spec.health_check.startup_deadline_seconds
                self._mark_unhealthy(cell, f"pods still missing after {deadline:g} s: " + obs.failures(),
                                     reason=Reason.StartupDeadlineExceeded)
                return
            await self._create(cell, whole=False)
            return
        if obs.any_failed or obs.restarts > cell.pod_restarts:
            cell.pod_restarts = obs.restarts
            self._mark_unhealthy(cell, "pod failed or restarted: " + obs.failures())
            return
        cell.pod_restarts = obs.restarts
        scheduled = sum(1 for p in obs.pods if p.node)
        if self.health.partly_scheduled_too_long(cell, scheduled, len(obs.pods)):
            deadline = self.spec.health_check.scheduling_deadline_seconds
            self._mark_unhealthy(cell, f"only {scheduled}/{len(obs.pods)} pods scheduled within {deadline:g} s: "
                                 "deleting the cell so that it holds no GPUs while it waits",
                                 reason=Reason.SchedulingDeadlineExceeded)
            return
        if cell.state is S.Pending and obs.all_running and cell.endpoint:
            self.fleet.move(cell, S.Starting, "pods running; waiting for the engine to answer")
            self.health.arm(cell.name)
        if self.health.startup_expired(cell):
            deadline = self.spec.health_check.startup_deadline_seconds
            self._mark_unhealthy(cell, f"not serving within {deadline:g} s", reason=Reason.StartupDeadlineExceeded)

    def _mark_unhealthy(self, cell: Cell, message: str, *, reason: str = Reason.CellUnhealthy) -> None:
        if cell.state in (S.Unhealthy, S.Failed):
            return
        self.fleet.move(cell, S.Unhealthy, message, reason=reason, warning=True)
        self.health.forget(cell.name)

    async def _heal(self, cell: Cell, obs: CellObservation | None, window_open: bool) -> None:
        """Unhealthy: stop its pods, then recreate after the backoff, within the budget."""
        now = self.clock.now()
        if cell.next_restart_time is None:
            # The backoff runs from the moment the cell became Unhealthy.
            due = self.budget.next_restart_time(cell.restarts, cell.last_transition_time or now)
            if due is None:
                self.fleet.move(cell, S.Failed,
                                f"restart budget of {self.spec.restart_policy.max_restarts} spent; last: {cell.message}",
                                reason=Reason.RestartBudgetExhausted, warning=True)
                self.fleet.record("restart_budget_exhausted", cell.name, restarts=cell.restarts)
                if obs is not None and not window_open:
                    await self.platform.delete_cell(cell.name)
                return
            cell.next_restart_time = due
            self.fleet.record("restart_scheduled", cell.name, at=iso(due), restarts=cell.restarts)
        if window_open:
            return  # deferred, not lost: next_restart_time stays and the first pass after the window acts
        if obs is not None and self._deleted_generation.get(cell.name) != obs.generation:
            await self.platform.delete_cell(cell.name)
            self._deleted_generation[cell.name] = obs.generation
        if now < cell.next_restart_time:
            return
        old_endpoint, old_generation = cell.endpoint, cell.generation
        cell.recreate(now, charge=True)
        await self.fleet.drop_client(old_endpoint)
        self.health.forget(cell.name)
        self.fleet.record("cell_replaced", cell.name, generation=cell.generation, restarts=cell.restarts)
        self.fleet.emit(Reason.CellReplaced,
                        f"generation {old_generation} -> {cell.generation} (restart {cell.restarts} of "
                        f"{self.spec.restart_policy.max_restarts})", cell.name)
        await self._create(cell)

    def _next_wakeup(self) -> float:
        now = self.clock.now()
        waits = [self.poll_seconds]
        if self.lock.current is not None:
            waits.append(self.lock.current.expires - now)
        for cell in self.fleet.all():
            if cell.state is S.Unhealthy and cell.next_restart_time is not None:
                waits.append(cell.next_restart_time - now)
            elif cell.state in (S.Pending, S.Starting):
                if not self.pods_wake_passes:
                    waits.append(STARTING_PROBE_SECONDS)
                if cell.created_time is not None:
                    waits.append(cell.created_time + self.spec.health_check.startup_deadline_seconds - now)
                    placed_by = cell.created_time + self.spec.health_check.scheduling_deadline_seconds
                    if placed_by > now:
                        waits.append(placed_by - now)
            if self.probes_wake_passes:
                probe = self._probe_wait(cell, now)
                if probe is not None:
                    waits.append(probe)
        return max(0.0, min(waits))

    def _probe_wait(self, cell: Cell, now: float) -> float | None:
        """Seconds until the cell's probe falls due (its running probe's deadline included)."""
        if cell.name in self._probing:
            return max(self.health.seconds_until_due(cell.name), self._probe_deadline.get(cell.name, now) - now)
        if self.health.wants_probe(cell):
            return self.health.seconds_until_due(cell.name)
        return None

    def seconds_until_probe(self) -> float | None:
        """Seconds until `probe_health` has a probe to start (None: none to start): when a driver
        whose passes do not wake for probes (`probes_wake_passes`) calls it next. A cell whose
        probe is out is not counted: that probe, and a failing cell's re-probes, run on their own."""
        waits = [self.health.seconds_until_due(c.name) for c in self.fleet.all()
                 if c.name not in self._probing and self.health.wants_probe(c)]
        return min(waits) if waits else None

    # == health =============================================================================

    async def probe_health(self, wait: float | None = None) -> None:
        """Start every due probe (each bounded by timeoutSeconds) and apply each answer as it comes.

        Each cell's probe runs on its own, so a hung engine delays nobody else: not the other
        cells' probes, not the reconcile pass that creates a replacement (which would otherwise
        wait for the slowest probe). `wait` bounds how long this call waits
        for the probes it started (None: until all are answered); a probe still out when it
        returns applies its answer later, under the mutex, and a state change it makes reaches
        the driver through `on_event` as any other.
        """
        async with self.fleet.mutex:
            due = [(c, self.fleet.client(c)) for c in self.fleet.all()
                   if c.name not in self._probing and self.health.wants_probe(c) and self.health.is_due(c.name)]
            started = [self._start_probe(c, client) for c, client in due]  # each: its first answer applied
        if not started or wait == 0:
            return
        if wait is None:
            await asyncio.wait(started)
            return
        answered = asyncio.ensure_future(asyncio.wait(started))
        timer = asyncio.ensure_future(self.clock.sleep(wait))
        try:
            await asyncio.wait({answered, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            answered.cancel()  # stops the waiting only: the probes go on and apply themselves

    def _start_probe(self, cell: Cell, client: EngineClient) -> asyncio.Future[None]:
        self._probe_deadline[cell.name] = self.clock.now() + self.spec.health_check.timeout_seconds
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._probing[cell.name] = asyncio.ensure_future(self._probe_and_apply(cell, client, answered))
        return answered

    async def _probe_and_apply(self, cell: Cell, client: EngineClient, answered: asyncio.Future[None]) -> None:
        """Probe, apply; while the cell fails (or is still starting), probe it again when due,
        on its own: counting failures to the threshold must not wait for passes, which a busy
        API server makes slow.

        The loop is bound to the generation and endpoint it started with: a cell is recreated
        (or its endpoint moves) in place, and a loop that went on with its old client probed the
        old engine's address for the new generation. It kept a new cell Starting, with no probe
        of its own, until the old address answered again (another pod given that IP, in a
        cluster) or the startup deadline passed."""
        generation, endpoint = cell.generation, cell.endpoint
        try:
            while True:
                outcome = await self.health.probe(cell, client)
                async with self.fleet.mutex:
                    current = self.fleet.get(outcome.cell)
                    if current is None or current.state not in (S.Starting, S.PendingWeights, S.Serving):
                        return
                    if (current.generation, current.endpoint) != (generation, endpoint):
                        return  # the cell was recreated or moved: the next pass probes the new engine
                    verdict = self._apply_probe(current, outcome)
                    label = self.fleet.start_serving_sync(current)
                    again = verdict is Verdict.failing and self.health.wants_probe(current)
                    wait = self.health.seconds_until_due(current.name) if again else 0.0
                if label is not None:  # outside the mutex: a job's cells are labelled at once, not in turn
                    await asyncio.shield(label)
                if not answered.done():
                    answered.set_result(None)
                if not again:
                    return
                self._probe_deadline[cell.name] = self.clock.now() + wait + self.spec.health_check.timeout_seconds
                await self.clock.sleep(wait)
        except Exception:
            log.exception("health probe of %s failed to apply", cell.name)
        finally:
            if not answered.done():
                answered.set_result(None)
            if self._probing.get(cell.name) is asyncio.current_task():
                del self._probing[cell.name]
                self._probe_deadline.pop(cell.name, None)

    def _apply_probe(self, cell: Cell, outcome: ProbeOutcome) -> Verdict:
        verdict = self.health.record(cell, outcome)
        if verdict is Verdict.healthy and cell.state is S.Starting:
            if self._may_serve_initial_weights(cell):
                cell.weight_version = self.fleet.weight_version
                self.fleet.move(cell, S.Serving, "engine answered; serving the initial weights")
            else:
                wait_for = "pinning" if self.fleet.role_of(cell.name) is CellRole.eval else "the next weight update"
                self.fleet.move(cell, S.PendingWeights, f"engine answered; waiting for {wait_for}")
        elif verdict is Verdict.unhealthy:
            self._mark_unhealthy(
                cell, f"{cell.consecutive_failures} consecutive failed probes; last: {outcome.error}")
        return verdict

    def _may_serve_initial_weights(self, cell: Cell) -> bool:
        return (self.serve_initial_weights and cell.name in self.fleet.cells and cell.generation == 0
                and self.fleet.weight_version is None and not self.lock.held)

    # == the reconcile pass and its loop ====================================================

    async def run_pass(self) -> PassReport:
        """One bounded pass, the unit the operator and local mode both drive: reconcile, then the
        due health probes, each within `pass_timeout_seconds`. Errors are logged and reported,
        never raised, so a failing platform or a hung engine costs one pass, not the loop; the
        driver decides what a failure means to its users (the operator turns it into a
        ReconcileError Event and metric, local mode only logs)."""
        delay = self.poll_seconds
        failures: list[str] = []
        try:
            delay = await call_within(self.clock, self.reconcile(), self.pass_timeout)
        except Exception as e:
            log.exception("reconcile of %s failed", self.job)
            failures.append(f"reconcile: {type(e).__name__}: {e}")
        try:
            await call_within(self.clock, self.probe_health(wait=PASS_PROBE_WAIT_SECONDS), self.pass_timeout)
        except Exception as e:
            log.exception("health probes of %s failed", self.job)
            failures.append(f"health probes: {type(e).__name__}: {e}")
        return PassReport(min(delay, self._next_wakeup()), tuple(failures))

    async def run(self, stop: asyncio.Event) -> None:
        """Run passes until `stop` is set."""
        while not stop.is_set():
            report = await self.run_pass()
            await sleep_or_stop(stop, max(report.delay, MIN_WAIT_SECONDS), self.clock)

    async def close(self) -> None:
        for task in list(self._probing.values()):
            task.cancel()
        async with self.fleet.mutex:
            await self.fleet.close()

    # == rollout, offload, onload ===========================================================

    def _refuse_in_window(self, what: str) -> None:
        if self.lock.current is not None:
            raise LockHeld(f"{what} is refused while the update window of {self.lock.current.holder!r} is open")

    async def prepare_rollout(self, rollout_id: int, wait_seconds: float | None = None) -> None:
        """Record the rollout and resume health monitoring; during an open window, wait for it.

        The wait is bounded by `wait_seconds` (default PREPARE_WAIT_SECONDS; the window itself
        is bounded by its lock's expiry) and then answers LockHeld naming the holder. The
        window's holder must not call this inside its own window: it would wait for itself.
        """
        wait = PREPARE_WAIT_SECONDS if wait_seconds is None else wait_seconds
        deadline = self.clock.now() + wait
        while True:
            async with self.fleet.mutex:
                await self._expire_lock_if_due()
                lock = self.lock.current
                if lock is None:
                    self.rollout_id = rollout_id
                    self.health.resume(PAUSE_OFFLOAD)
                    self.fleet.record("rollout_prepared", rollout_id=rollout_id)
                    self.fleet.emit(Reason.RolloutPrepared, f"rollout {rollout_id}; health monitoring active")
                    return
                left = deadline - self.clock.now()
                if left <= 0:
                    waited = f"waited {wait:g} s for" if wait > 0 else "is refused while"
                    raise LockHeld(f"prepare_rollout {waited} the update window of {lock.holder!r} "
                                   f"(open since {iso(lock.since)}, expires {iso(lock.expires)})")
            await self.clock.sleep(min(LOCK_POLL_SECONDS, left))

    async def offload(self, tags: Sequence[MemoryTag | str] | None = None) -> MemoryChange:
        """Release engine memory (default: spec.offload.tags) of every PendingWeights/Serving cell."""
        wanted = memory_tags(tags if tags is not None else self.spec.offload.tags)
        async with self.fleet.mutex:
            await self._expire_lock_if_due()
            self._refuse_in_window("offload")
            return await self.memory.offload(wanted)

    async def onload(self, tags: Sequence[MemoryTag | str] | None = None) -> MemoryChange:
        """Take memory back; when the weights are back, the cell returns to its state before offload."""
        wanted = memory_tags(tags if tags is not None else list(MemoryTag))
        async with self.fleet.mutex:
            await self._expire_lock_if_due()
            self._refuse_in_window("onload")
            return await self.memory.onload(wanted)

    # == the eval fleet ======================================================================

    async def eval_fleet(self, checkpoint: str | None = None, weight_version: str | None = None) -> EvalFleet:
        """Pin the eval fleet to spec.inference.eval's checkpoint (or to an eval point's `checkpoint`)
        and say whether eval may run (see `evalfleet.EvalCells.pin`)."""
        return await self.eval.pin(self.spec, checkpoint, weight_version)

    async def record_eval(self, point: RecordEvalRequest) -> EvalStatus:
        """An evaluation of the policy (spec.rollout.eval) becomes status.lastEval."""
        async with self.fleet.mutex:
            return self.eval.record(point)

    # == the weight-update window ===========================================================

    async def start_update_weights(self, holder: str, ready_timeout: float | None = None) -> UpdateWindow:
        """Take the lock; answer the participants (PendingWeights/Serving cells) sorted by index.

        With `ready_timeout`, first wait (without holding anything) up to that long until every
        cell that is not Failed can take weights, as miles does for a fresh fleet; `run()` must
        be driving the cells meanwhile.
        """
        if ready_timeout is not None:
            await self._wait_until_ready(ready_timeout)
        async with self.fleet.mutex:
            await self._expire_lock_if_due()
            if self.lock.current is not None:
                raise LockHeld(f"the update window is held by {self.lock.current.holder!r} "
                               f"until {iso(self.lock.current.expires)}")
            snapshot = take_snapshot(self.fleet.cells.values())
            if not snapshot:
                raise NoReadyEngines("no engine cell is PendingWeights or Serving: "
                                     + ", ".join(f"{c.name}={c.state}" for c in self.fleet.policy()))
            now = self.clock.now()
            lock = self.lock.acquire(holder, snapshot, now)
            self.health.pause(PAUSE_WINDOW)
            # Cells created serving that still start would join with the initial weights once up,
            # after the window has replaced them: out before the window is answered.
            await self.fleet.sync_serving_all(self.fleet.revoke_admissions())
            if self.spec.weight_update.check_weights:
                try:
                    lock.checksums = await collect_checksums(self._participant_clients(lock), self.clock,
                                                             self.call_timeout)
                except Exception:
                    self.lock.release()
                    self.health.resume(PAUSE_WINDOW)
                    raise
            engines = window_engines(self.fleet.cells.values(), snapshot, self.spec.gpus_per_engine)
            self.fleet.record("window_opened", holder=holder, snapshot=snapshot, expires=iso(lock.expires))
            self.fleet.emit(Reason.WindowOpened, f"{holder} opened an update window over {len(engines)} cells")
            return UpdateWindow(engines=engines, snapshot=dict(snapshot), lock=lock.to_status())

    async def _wait_until_ready(self, seconds: float) -> None:
        deadline = self.clock.now() + seconds
        while self.clock.now() < deadline:
            live = [c for c in self.fleet.cells.values() if c.state is not S.Failed]
            if live and len(self.fleet.cells) >= self.spec.replicas and all(c.state in UPDATABLE for c in live):
                return
            await self.clock.sleep(min(READY_POLL_SECONDS, max(0.0, deadline - self.clock.now())))

    def _participant_clients(self, lock: WindowLock) -> dict[str, EngineClient]:
        return {c.name: self.fleet.client(c) for c in cells_to_serve(self.fleet.cells.values(), lock.snapshot) if c.endpoint}

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
        A repeat of the call that ended the window answers the same and changes nothing.
        """
        async with self.fleet.mutex:
            await self._expire_lock_if_due()  # a window past its expiry cannot be ended any more
            repeated = self.lock.repeated_close(snapshot, ended=True, version=weight_version)
            if repeated is not None:
                return repeated
            lock = self.lock.check(snapshot)
            version = weight_version if weight_version is not None else _next_version(self.fleet.weight_version)
            if self.spec.weight_update.check_weights or expected_checksums is not None:
                await self._check_weights(lock, expected_checksums)
            served = cells_to_serve(self.fleet.cells.values(), lock.snapshot)
            for cell in served:
                cell.weight_version = version
                self.fleet.move(cell, S.Serving, f"weights {version}")
            self.fleet.weight_version = version
            self.lock.release()
            self.lock.closed = ClosedWindow(lock.snapshot, True, version, [c.name for c in served])
            self.health.resume(PAUSE_WINDOW)
            await self.fleet.sync_serving_all(served)
            took = self.clock.now() - lock.since
            self.fleet.record("weights_updated", version=version, cells=[c.name for c in served],
                             seconds=round(took, 3), holder=lock.holder)
            self.fleet.emit(Reason.WeightsUpdated, f"weights updated to v{version} in {took:.1f} s "
                       f"({len(served)} cells serving)", outcome="completed")
            return [c.name for c in served]

    async def _check_weights(self, lock: WindowLock, expected: dict[str, str] | None) -> None:
        clients = self._participant_clients(lock)
        try:
            after = await collect_checksums(clients, self.clock, self.call_timeout, received=expected is not None)
            mismatched = compare_checksums(after, expected)
        except Exception as exc:
            after, mismatched = {}, {name: [f"<unreadable: {type(exc).__name__}: {exc}>"] for name in clients}
        self.fleet.record("weight_check", ok=not mismatched, mismatched=mismatched,
                         changed=changed_tensors(lock.checksums or {}, after))
        if mismatched:
            await self._abort_locked(lock, "weight check failed", outcome="check_failed")
            self.fleet.emit(Reason.WeightCheckFailed, str(WeightCheckMismatch(mismatched)), warning=True)
            raise WeightCheckMismatch(mismatched)

    async def abort_update_weights(self, snapshot: dict[str, int]) -> list[str]:
        """Stop every participant whose generation has not changed; always release the lock.

        A window already aborted (by this call made before, or by its expiry) answers the same."""
        async with self.fleet.mutex:
            await self._expire_lock_if_due()
            repeated = self.lock.repeated_close(snapshot, ended=False)
            if repeated is not None:
                return repeated
            lock = self.lock.check(snapshot)
            return await self._abort_locked(lock, f"update window of {lock.holder!r} aborted")

    async def _abort_locked(self, lock: WindowLock, why: str, *, reason: str = Reason.WindowAborted,
                            outcome: str = "aborted") -> list[str]:
        stopped: list[str] = []
        failures: list[str] = []
        try:
            to_stop = cells_to_stop(self.fleet.cells.values(), lock.snapshot)
            dead = dead_at_abort(to_stop, *await self._death_evidence(to_stop))
            for cell in to_stop:
                if cell.name in dead:  # healed like any dead cell once the lock is released: charged
                    self._mark_unhealthy(cell, f"{dead[cell.name]} (found as {why})")
                    stopped.append(cell.name)
                    continue
                self.fleet.move(cell, S.Unhealthy, f"stopped: {why}", reason=reason, warning=True)
                old_generation, old_endpoint = cell.generation, cell.endpoint
                try:
                    await call_within(self.clock, self.platform.delete_cell(cell.name), self.call_timeout)
                    self._deleted_generation[cell.name] = old_generation
                except Exception as exc:  # reconcile deletes the stale generation later
                    failures.append(f"{cell.name}: {type(exc).__name__}: {exc}")
                cell.recreate(self.clock.now(), charge=False)
                self.health.forget(cell.name)
                await self.fleet.drop_client(old_endpoint)
                stopped.append(cell.name)
        finally:
            self.lock.release()
            self.lock.closed = ClosedWindow(lock.snapshot, False, None, list(stopped))
            self.health.resume(PAUSE_WINDOW)
        self.fleet.record("window_aborted", holder=lock.holder, why=why, outcome=outcome, stopped=stopped,
                          failures=failures)
        self.fleet.emit(reason, f"{why}: stopped {stopped or 'no cells'}"
                   + (f"; stopping failed for {failures} (retried by reconcile)" if failures else ""),
                   warning=True, outcome=outcome)
        return stopped

    async def _death_evidence(
        self, cells: Sequence[Cell]
    ) -> tuple[dict[str, CellObservation] | None, dict[str, str]]:
        """What `dead_at_abort` judges from: the platform's cells (None when that read fails) and
        the engines that refuse a health probe, read at once and bounded by a few seconds, so
        that an abort (which must release the lock) never waits long on a hung engine or a slow
        API server: a refusal is immediate, and what is not known in time counts as alive."""
        timeout = min(self.spec.health_check.timeout_seconds, ABORT_EVIDENCE_SECONDS)

        async def observe() -> dict[str, CellObservation] | None:
            try:
                return {o.name: o for o in await call_within(self.clock, self.platform.observe_cells(), timeout)}
            except Exception:
                return None

        async def refused(cell: Cell) -> str | None:
            try:
                await call_within(self.clock, self.fleet.client(cell).health(), timeout)
            except EngineUnavailable as exc:
                return f"its engine is unreachable: {exc}"
            except Exception:
                return None  # slow or odd, not proven dead
            return None

        probed = [c for c in cells if c.endpoint and c.state is not S.Offloaded]
        observing = asyncio.ensure_future(observe())
        answers = await asyncio.gather(*(refused(c) for c in probed))
        return await observing, {c.name: a for c, a in zip(probed, answers, strict=True) if a is not None}

    async def _expire_lock_if_due(self) -> tuple[WindowLock, list[str]] | None:
        """Abort the open window if it is past its expiry; returns it and the cells stopped."""
        lock = self.lock.expired(self.clock.now())
        if lock is None:
            return None
        self.fleet.emit(Reason.LockExpired, f"update window of {lock.holder!r} open since {iso(lock.since)} "
                   f"expired at {iso(lock.expires)}; aborting it", warning=True)
        self.fleet.record("lock_expired", holder=lock.holder, since=iso(lock.since), expires=iso(lock.expires))
        return lock, await self._abort_locked(lock, f"lock of {lock.holder!r} expired", outcome="expired")


def _next_version(current: str | None) -> str:
    if current is None:
        return "1"
    if current.isdigit():
        return str(int(current) + 1)
    raise ValueError(f"weight version {current!r} is not numeric: pass weight_version explicitly")
