"""The engine cell state machine and the `Cell` record the controller keeps per cell.

A cell is the unit of restart: all pods of one engine. Its life is
`Pending -> Starting -> PendingWeights -> Serving`, with `Offloaded` (weights released),
`Unhealthy` (failed probes, dead pods, a missed startup deadline, or stopped by an aborted
window) and `Failed` (restart budget spent). A recreation is not a transition of the same
incarnation: it starts a new generation in `Pending` and is only legal from `Unhealthy` or
`Failed` (see `Cell.recreate`).

The table is pure data so that the rules can be read in one place and tested exhaustively;
`Cell` converts to and from `api.status.EngineStatus`, which is how state survives an
operator restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller_runtime.api.spec import MemoryTag
from controller_runtime.api.status import CellState, EngineStatus
from controller_runtime.clock import iso, parse_iso
from controller_runtime.errors import ControllerError

S = CellState

# from-state -> the states it may move to. Every live state may become Unhealthy (probe
# failures, dead pods, startup deadline, an aborted window stopping it) or Failed.
TRANSITIONS: Mapping[CellState, frozenset[CellState]] = {
    S.Pending: frozenset({S.Starting, S.Unhealthy, S.Failed}),
    S.Starting: frozenset({S.PendingWeights, S.Serving, S.Unhealthy, S.Failed}),
    S.PendingWeights: frozenset({S.Serving, S.Offloaded, S.Unhealthy, S.Failed}),
    S.Serving: frozenset({S.Offloaded, S.Unhealthy, S.Failed}),
    S.Offloaded: frozenset({S.PendingWeights, S.Serving, S.Unhealthy, S.Failed}),
    # Unhealthy -> Pending is a recreation (a new generation), see Cell.recreate.
    S.Unhealthy: frozenset({S.Pending, S.Failed}),
    # Failed -> Pending only when the budget grew (the user raised maxRestarts).
    S.Failed: frozenset({S.Pending}),
}

# Cells whose engine holds weights the trainer can update: the window's participants.
UPDATABLE: frozenset[CellState] = frozenset({S.PendingWeights, S.Serving})
# Cells whose pods exist and whose engine has loaded (health is probed as liveness).
LOADED: frozenset[CellState] = frozenset({S.PendingWeights, S.Serving, S.Offloaded})


class IllegalTransition(ControllerError):
    """A caller asked for a state change the cell lifecycle does not allow."""

    def __init__(self, cell: str, source: CellState, target: CellState) -> None:
        super().__init__(f"cell {cell}: illegal transition {source} -> {target}")
        self.cell = cell
        self.source = source
        self.target = target


def is_legal(source: CellState, target: CellState) -> bool:
    """Whether `source -> target` is in the table (staying in the same state is not a transition)."""
    return target in TRANSITIONS[CellState(source)]


def check_transition(cell: str, source: CellState, target: CellState) -> None:
    if not is_legal(source, target):
        raise IllegalTransition(cell, CellState(source), CellState(target))


def cell_name(job: str, index: int) -> str:
    """Deterministic name, so a restarted or retried reconcile never doubles a cell."""
    return f"{job}-cell-{index}"


def eval_cell_name(job: str, index: int) -> str:
    """Cell `index` of the eval fleet (spec.inference.eval), deterministic like `cell_name`."""
    return f"{job}-eval-{index}"


def is_eval_cell(job: str, name: str) -> bool:
    """Whether `name` is an eval-fleet cell of `job`: status keeps only names across restarts."""
    return name.startswith(f"{job}-eval-")


@dataclass
class Cell:
    """What the controller knows about one engine cell (one incarnation per generation)."""

    name: str
    index: int
    generation: int = 0
    state: CellState = CellState.Pending
    pods: tuple[str, ...] = ()
    endpoint: str | None = None
    memory: tuple[MemoryTag, ...] = ()  # released tags
    state_before_offload: CellState | None = None
    weight_version: str | None = None
    consecutive_failures: int = 0
    restarts: int = 0  # recreations charged to the restart budget
    pod_restarts: int = 0  # container restarts last observed on the platform
    last_probe_time: float | None = None
    last_transition_time: float | None = None
    next_restart_time: float | None = None
    created_time: float | None = None  # when this generation was asked for (startup deadline)
    message: str = ""

    def transition(self, target: CellState, now: float, message: str = "") -> bool:
        """Move to `target` (validated); returns False when already there (no event is due)."""
        target = CellState(target)
        if target == self.state:
            if message:
                self.message = message
            return False
        check_transition(self.name, self.state, target)
        self.state = target
        self.last_transition_time = now
        self.message = message
        return True

    def recreate(self, now: float, *, charge: bool) -> None:
        """Start the next generation in Pending; `charge` counts it against the restart budget."""
        check_transition(self.name, self.state, CellState.Pending)
        if charge:
            self.restarts += 1
        self._new_incarnation(self.generation + 1, now)
        self.message = f"recreated as generation {self.generation}"

    def adopt(self, generation: int, now: float) -> None:
        """Take over a newer generation found on the platform (created by a controller that died
        before recording it). Not a transition: whatever this record said, those pods start afresh."""
        self._new_incarnation(generation, now)
        self.message = f"adopted generation {generation} found on the platform"

    def _new_incarnation(self, generation: int, now: float) -> None:
        self.generation = generation
        self.state = CellState.Pending
        self.pods = ()
        self.endpoint = None
        self.memory = ()
        self.state_before_offload = None
        self.weight_version = None
        self.consecutive_failures = 0
        self.pod_restarts = 0
        self.last_probe_time = None
        self.next_restart_time = None
        self.last_transition_time = now
        self.created_time = now

    def to_status(self) -> EngineStatus:
        return EngineStatus(
            name=self.name,
            index=self.index,
            state=self.state,
            generation=self.generation,
            pods=list(self.pods),
            endpoint=self.endpoint,
            memory=[str(t) for t in self.memory],
            state_before_offload=self.state_before_offload,
            weight_version=self.weight_version,
            consecutive_failures=self.consecutive_failures,
            restarts=self.restarts,
            pod_restarts=self.pod_restarts,
            last_probe_time=_iso_or_none(self.last_probe_time),
            last_transition_time=_iso_or_none(self.last_transition_time),
            next_restart_time=_iso_or_none(self.next_restart_time),
            message=self.message,
        )

    @classmethod
    def from_status(cls, status: EngineStatus) -> Cell:
        """Rebuild from what the operator wrote; times are second-precision as Kubernetes keeps them."""
        transition = _parse_or_none(status.last_transition_time)
        return cls(
            name=status.name,
            index=status.index,
            generation=status.generation,
            state=status.state,
            pods=tuple(status.pods),
            endpoint=status.endpoint,
            memory=tuple(MemoryTag(t) for t in status.memory),
            state_before_offload=status.state_before_offload,
            weight_version=status.weight_version,
            consecutive_failures=status.consecutive_failures,
            restarts=status.restarts,
            pod_restarts=status.pod_restarts,
            last_probe_time=_parse_or_none(status.last_probe_time),
            last_transition_time=transition,
            next_restart_time=_parse_or_none(status.next_restart_time),
            # A restored Pending/Starting cell measures its startup deadline from its last transition.
            created_time=transition,
            message=status.message,
        )


def _iso_or_none(ts: float | None) -> str | None:
    return None if ts is None else iso(ts)


def _parse_or_none(text: str | None) -> float | None:
    return None if not text else parse_iso(text)
