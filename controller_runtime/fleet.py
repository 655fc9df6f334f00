"""The cells of one job's two fleets, and what every part of the controller acts on them through.

A job has a policy fleet (`<job>-cell-<i>`: takes weight updates, serves rollouts) and, when
spec.inference.eval is set, an eval fleet (`<job>-eval-<i>`: pinned to a checkpoint, never in
the policy's serving set). Both are `Cell`s on one platform, so they share what acting on a
cell takes: one engine client per endpoint, the platform's serving label, state moves that
are audited and announced, and the mutex under which every decision is made.

`Fleet` holds all of that and nothing else; the controller (reconcile, probes, the weight
window), `memory.FleetMemory` (offload/onload) and `evalfleet.EvalCells` (pinning) are
collaborators over one `Fleet`, so no cell state lives in two places. Which fleet a cell
belongs to is decided here alone (`role_of`), from its name, because that is all that
`RLJob.status` keeps of a cell across an operator restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from controller_runtime.api.status import CellState
from controller_runtime.audit import AuditWriter
from controller_runtime.cells import Cell, cell_name, eval_cell_name, is_eval_cell
from controller_runtime.clock import Clock
from controller_runtime.deadline import call_within
from controller_runtime.events import ControllerEvent, Reason
from controller_runtime.ports import CellRole, EngineClient, EngineClientFactory, Platform

log = logging.getLogger(__name__)

S = CellState
T = TypeVar("T")

# The event a move into a state announces unless the caller names a more specific reason.
_MOVE_REASONS: dict[CellState, str] = {
    S.Starting: Reason.CellStarting,
    S.PendingWeights: Reason.CellPendingWeights,
    S.Serving: Reason.CellServing,
    S.Unhealthy: Reason.CellUnhealthy,
    S.Failed: Reason.RestartBudgetExhausted,
    S.Offloaded: Reason.Offloaded,
}


class Fleet:
    def __init__(
        self,
        job: str,
        platform: Platform,
        engines: EngineClientFactory,
        clock: Clock,
        *,
        audit: AuditWriter | None = None,
        on_event: Callable[[ControllerEvent], None] | None = None,
        call_timeout: float = 120.0,
    ) -> None:
        self.job = job
        self.platform = platform
        self.engines = engines
        self.clock = clock
        self.audit = audit
        self.on_event = on_event
        self.call_timeout = call_timeout
        self.cells: dict[str, Cell] = {}  # the policy fleet
        self.eval_cells: dict[str, Cell] = {}  # the eval fleet
        self.weight_version: str | None = None  # of the policy fleet: what a serving cell must hold
        # Every decision about cells is taken under this lock; engine calls that may take long
        # (probes, checkpoint loads) run outside it and re-check what they acted on.
        self.mutex = asyncio.Lock()
        self._clients: dict[str, EngineClient] = {}
        self._serving_label: dict[str, bool] = {}  # last label the platform accepted (or is being sent)
        # Cells created serving (`admit`): labelled serving while they start, until they serve or a
        # window takes them out.
        self._admitted: set[str] = set()
        self._label_writes: dict[str, asyncio.Task[None]] = {}  # a cell's label write in flight

    # == membership ===========================================================================

    def role_of(self, name: str) -> CellRole:
        return CellRole.eval if is_eval_cell(self.job, name) else CellRole.policy

    def name_of(self, role: CellRole, index: int) -> str:
        return eval_cell_name(self.job, index) if role is CellRole.eval else cell_name(self.job, index)

    def group(self, role: CellRole) -> dict[str, Cell]:
        return self.eval_cells if role is CellRole.eval else self.cells

    def add(self, cell: Cell) -> None:
        self.group(self.role_of(cell.name))[cell.name] = cell

    def get(self, name: str) -> Cell | None:
        return self.cells.get(name) or self.eval_cells.get(name)

    def known(self, name: str) -> bool:
        return name in self.cells or name in self.eval_cells

    def remove(self, name: str) -> Cell | None:
        """Forget a deleted cell (its client is the caller's to drop: that awaits)."""
        self._serving_label.pop(name, None)
        self._admitted.discard(name)
        return self.cells.pop(name, None) or self.eval_cells.pop(name, None)

    def ensure_cells(self, role: CellRole, replicas: int, now: float) -> None:
        """Every index below `replicas` has a record (a new one is Pending: reconcile creates it)."""
        group = self.group(role)
        for index in range(replicas):
            name = self.name_of(role, index)
            if name not in group:
                group[name] = Cell(name, index, created_time=now, last_transition_time=now)

    def surplus(self, role: CellRole, replicas: int) -> list[Cell]:
        return [c for c in self.group(role).values() if c.index >= replicas]

    def policy(self) -> list[Cell]:
        """The policy fleet, by index."""
        return sorted(self.cells.values(), key=lambda c: c.index)

    def evals(self) -> list[Cell]:
        """The eval fleet, by index."""
        return sorted(self.eval_cells.values(), key=lambda c: c.index)

    def all(self) -> list[Cell]:
        """Policy cells, then eval cells: the order of status.engines."""
        return self.policy() + self.evals()

    # == events and audit =====================================================================

    def emit(self, reason: str, message: str, cell: str | None = None, warning: bool = False,
             outcome: str | None = None) -> None:
        event = ControllerEvent(reason, message, cell, warning, outcome)
        (log.warning if warning else log.info)("%s", event)
        self.record("event", cell, reason=reason, message=message, warning=warning)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event callback failed for %s", event)

    def record(self, type: str, cell: str | None = None, **fields: Any) -> bool:
        """An audit record; the audit log must never break the controller, so failures are logged."""
        if self.audit is None:
            return False
        try:
            self.audit.record(type, cell, **fields)
            return True
        except Exception:
            log.exception("audit record %s failed", type)
            return False

    def move(self, cell: Cell, target: CellState, message: str = "", *, reason: str | None = None,
             warning: bool = False, announce: bool = True) -> bool:
        """A validated state move, audited and announced; False when the cell was already there.

        `announce=False`: audited only, for moves that a fleet-wide operation announces once
        (offload, onload): an Event per cell would be most of the API writes such an operation causes."""
        source = cell.state
        if not cell.transition(target, self.clock.now(), message):
            return False
        self.record("cell_transition", cell.name, generation=cell.generation, **{"from": str(source)},
                    to=str(target), message=message)
        reason = reason or _MOVE_REASONS.get(target)
        if reason and announce:
            text = f"{source} -> {target}" + (f": {message}" if message else "")
            self.emit(reason, text, cell.name, warning or target in (S.Unhealthy, S.Failed))
        return True

    # == serving label ========================================================================

    def should_serve(self, cell: Cell) -> bool:
        """In the policy's serving set (eval cells never are: they serve evaluation only)."""
        return cell.name in self.cells and cell.state is S.Serving and not cell.memory

    def serving_endpoints(self) -> list[str]:
        return [c.endpoint for c in self.policy() if self.should_serve(c) and c.endpoint]

    def wants_label(self, cell: Cell) -> bool:
        """The serving label the cell's pods should carry: in the serving set, or created in it
        (`label_created(admit=True)`) and still starting, for the platform to admit when ready."""
        if self.should_serve(cell):
            return True
        return cell.name in self._admitted and cell.state in (S.Pending, S.Starting)

    def label_unknown(self, name: str) -> None:
        """New pods: their serving label is unknown until the next sync sets it."""
        self._serving_label.pop(name, None)
        self._admitted.discard(name)

    def revoke_admissions(self) -> list[Cell]:
        """Starting cells created serving that must leave the serving set before they join it (a
        weight-update window opens: they hold the initial weights, which the window replaces);
        the caller syncs their labels."""
        revoked = [c for n in sorted(self._admitted) if (c := self.get(n)) is not None and not self.should_serve(c)]
        self._admitted.clear()
        return revoked

    async def sync_serving_all(self, cells: Iterable[Cell]) -> None:
        """`sync_serving` of many cells at once: each is an API round trip or two on Kubernetes, which
        one after another would add up on a fleet-wide offload."""
        await asyncio.gather(*(self.sync_serving(c) for c in cells))

    def label_created(self, name: str, admit: bool = False) -> None:
        """Every pod of a cell was just created with the serving label `admit` (not serving unless
        asked): the first sync has nothing to write, where writing `false` onto every new pod would
        cost a list and a patch per pod. An admitted cell keeps its label while it starts and when
        it comes to serve: no write."""
        self._serving_label[name] = admit
        if admit:
            self._admitted.add(name)
        else:
            self._admitted.discard(name)

    async def sync_serving(self, cell: Cell) -> None:
        """Make the platform's serving label match the cell; a failure is retried by the next pass."""
        write = self.start_serving_sync(cell)
        if write is not None:
            await asyncio.shield(write)  # a cancelled caller does not cancel a write others wait on

    def start_serving_sync(self, cell: Cell) -> asyncio.Task[None] | None:
        """Decide (under the mutex) whether the cell's label must change, and start the write; the
        caller may leave the mutex before awaiting it, so a job's cells that answer their probes
        together become Serving together, not one PATCH after another. One write per cell at a
        time, so two PATCHes of one cell never race: a decision taken while one is out waits for
        it, and it re-checks the cell when done."""
        running = self._label_writes.get(cell.name)
        if running is not None:
            return running
        want = self.wants_label(cell)
        if self._serving_label.get(cell.name) == want:
            return None
        self._serving_label[cell.name] = want
        write = asyncio.ensure_future(self._write_serving(cell.name, want, cell.generation))
        self._label_writes[cell.name] = write
        return write

    async def _write_serving(self, name: str, want: bool, generation: int) -> None:
        """Send the label, then re-check the cell: what it should be now (it may have changed, or
        been recreated, while the call was out) is sent next, until the label is current."""
        try:
            while True:
                try:
                    await call_within(self.clock, self.platform.set_serving(name, want), self.call_timeout)
                except Exception as exc:
                    cell = self.get(name)
                    if self._serving_label.get(name) == want and cell is not None and cell.generation == generation:
                        self._serving_label.pop(name, None)  # unknown: the next sync writes it again
                    log.warning("set_serving(%s, %s) failed: %s", name, want, exc)
                    return
                cell = self.get(name)
                if cell is None:
                    return
                want, generation = self.wants_label(cell), cell.generation
                if self._serving_label.get(name) == want:
                    return
                self._serving_label[name] = want
        finally:
            del self._label_writes[name]

    # == engine clients =======================================================================

    def client(self, cell: Cell) -> EngineClient:
        """The cell's engine client, one per endpoint (only for a cell whose endpoint is known)."""
        assert cell.endpoint is not None
        client = self._clients.get(cell.endpoint)
        if client is None:
            client = self._clients[cell.endpoint] = self.engines(cell.endpoint)
        return client

    async def drop_client(self, endpoint: str | None) -> None:
        client = self._clients.pop(endpoint, None) if endpoint else None
        if client is not None:
            try:
                await client.close()
            except Exception as exc:
                log.debug("closing client %s: %s", endpoint, exc)

    async def engine_call(self, call: Awaitable[T]) -> T:
        return await call_within(self.clock, call, self.call_timeout)

    async def close(self) -> None:
        for endpoint in list(self._clients):
            await self.drop_client(endpoint)
