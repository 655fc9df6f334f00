"""Per-cell health checking: probe schedule, consecutive-failure threshold, pause epochs.

Monitoring is paused while memory is offloaded or a weight-update window is open (an engine
with released memory or half-loaded weights may answer badly without being broken). Each
pause and resume bumps `epoch`; a probe remembers the epoch it started in and its answer is
discarded when the epoch moved meanwhile, so a probe sent before an offload cannot mark a
cell Unhealthy after it. Every resume re-arms `initialDelaySeconds` for every cell.

The monitor keeps only the schedule and the epoch; failure counts live on `Cell` (they are
part of the status that survives an operator restart).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from controller_runtime.api.spec import HealthCheckSpec
from controller_runtime.api.status import CellState
from controller_runtime.cells import Cell
from controller_runtime.clock import Clock
from controller_runtime.deadline import call_within
from controller_runtime.ports import EngineClient

# A starting engine is probed at most this far apart (or intervalSeconds, if shorter), and a
# pending or starting cell is looked at again after as long unless its pods' changes wake
# passes (`InferenceController.pods_wake_passes`): its first answer is what turns a
# replacement into PendingWeights, and at intervalSeconds (miles: 30 s) a replacement that listens
# a moment after its first probe would wait a whole interval for the next. A starting engine
# answers with a refused connection, which costs nothing.
STARTING_PROBE_SECONDS = 0.5


class Verdict(StrEnum):
    healthy = "healthy"  # the probe succeeded; failures reset
    failing = "failing"  # failed, still under the threshold
    unhealthy = "unhealthy"  # the threshold is reached
    discarded = "discarded"  # answered in an older epoch or for an older generation


@dataclass(frozen=True)
class ProbeOutcome:
    cell: str
    generation: int
    epoch: int
    ok: bool
    error: str
    finished: float


class HealthMonitor:
    """Probe scheduling and verdicts for every cell of one controller."""

    def __init__(self, spec: HealthCheckSpec, clock: Clock) -> None:
        self.spec = spec
        self.clock = clock
        self.epoch = 0
        self._pause_reasons: set[str] = set()
        self._next_due: dict[str, float] = {}

    # -- pause / resume -------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return not self._pause_reasons

    def pause(self, reason: str) -> None:
        """Stop liveness probing for `reason` (e.g. "offload", "window"); bumps the epoch."""
        if reason not in self._pause_reasons:
            self._pause_reasons.add(reason)
            self.epoch += 1

    def resume(self, reason: str) -> None:
        """Clear `reason`; when nothing pauses any more, re-arm the initial delay of every cell."""
        if reason in self._pause_reasons:
            self._pause_reasons.discard(reason)
            self.epoch += 1
            if self.active:
                now = self.clock.now()
                for name in self._next_due:
                    self._next_due[name] = now + self.spec.initial_delay_seconds

    # -- schedule -------------------------------------------------------------------------

    def arm(self, name: str) -> None:
        """(Re)start a cell's schedule: its first probe is due after the initial delay."""
        self._next_due[name] = self.clock.now() + self.spec.initial_delay_seconds

    def forget(self, name: str) -> None:
        self._next_due.pop(name, None)

    def is_due(self, name: str) -> bool:
        if name not in self._next_due:
            self.arm(name)
        return self.clock.now() >= self._next_due[name]

    def seconds_until_due(self, name: str) -> float:
        if name not in self._next_due:
            self.arm(name)
        return max(0.0, self._next_due[name] - self.clock.now())

    def period(self, cell: Cell) -> float:
        """Seconds from one probe of the cell to its next."""
        if cell.state == CellState.Starting:
            return min(self.spec.interval_seconds, STARTING_PROBE_SECONDS)
        return self.spec.interval_seconds

    def wants_probe(self, cell: Cell) -> bool:
        """Starting cells are probed for readiness even while paused; loaded cells only when active."""
        if cell.endpoint is None:
            return False
        if cell.state == CellState.Starting:
            return True
        return self.active and cell.state in (CellState.PendingWeights, CellState.Serving)

    def startup_expired(self, cell: Cell) -> bool:
        """A cell that has not loaded within startupDeadlineSeconds of its creation."""
        if cell.state not in (CellState.Pending, CellState.Starting) or cell.created_time is None:
            return False
        return self.clock.now() - cell.created_time >= self.spec.startup_deadline_seconds

    def partly_scheduled_too_long(self, cell: Cell, scheduled: int, pods: int) -> bool:
        """A cell some of whose pods hold a node (and its GPUs) while others wait, past the deadline.

        Without a gang scheduler (or Kueue) the scheduler places pods one by one, so a cell can
        hold half its GPUs forever while the rest never fit; two such cells can deadlock.
        """
        if cell.state is not CellState.Pending or cell.created_time is None or not 0 < scheduled < pods:
            return False
        return self.clock.now() - cell.created_time >= self.spec.scheduling_deadline_seconds

    # -- probing --------------------------------------------------------------------------

    async def probe(self, cell: Cell, client: EngineClient) -> ProbeOutcome:
        """One probe bounded by timeoutSeconds. Any exception, a timeout or garbage is a failure."""
        epoch, generation = self.epoch, cell.generation
        self._next_due[cell.name] = self.clock.now() + self.period(cell)
        ok, error = True, ""
        try:
            await call_within(self.clock, client.health(), self.spec.timeout_seconds)
        except TimeoutError:
            ok, error = False, f"health probe timed out after {self.spec.timeout_seconds:g} s"
        except Exception as exc:  # an engine answering garbage raises anything; all are failures
            ok, error = False, f"health probe failed: {type(exc).__name__}: {exc}"
        return ProbeOutcome(cell.name, generation, epoch, ok, error, self.clock.now())

    def record(self, cell: Cell, outcome: ProbeOutcome) -> Verdict:
        """Apply a probe's answer to the cell, unless it is stale."""
        if outcome.epoch != self.epoch or outcome.generation != cell.generation or outcome.cell != cell.name:
            return Verdict.discarded
        cell.last_probe_time = outcome.finished
        if outcome.ok:
            cell.consecutive_failures = 0
            return Verdict.healthy
        if cell.state == CellState.Starting:
            # An engine still loading refuses probes; only the startup deadline bounds it.
            return Verdict.failing
        cell.consecutive_failures += 1
        if cell.consecutive_failures >= self.spec.failure_threshold:
            return Verdict.unhealthy
        return Verdict.failing
