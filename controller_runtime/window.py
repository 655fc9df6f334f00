"""The weight-update window: who participates, what the trainer is told, who serves after.

Pure functions over `Cell`s. The snapshot `{cell name: generation}` taken at window start is
the whole trick: a cell recreated while the window is open has a new generation, so it is
neither promoted to Serving by `end` (it never received the new weights) nor stopped by
`abort` (it never received broken ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller_runtime.api.status import LockStatus
from controller_runtime.cells import LOADED, UPDATABLE, Cell
from controller_runtime.ports import CellObservation


@dataclass(frozen=True)
class WindowEngine:
    """One participant as the trainer needs it: where to push, and which GPUs it spans."""

    name: str
    index: int
    endpoint: str
    generation: int
    gpu_count: int
    gpu_offset: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "index": self.index,
            "endpoint": self.endpoint,
            "generation": self.generation,
            "gpuCount": self.gpu_count,
            "gpuOffset": self.gpu_offset,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowEngine:
        return cls(
            name=data["name"],
            index=int(data["index"]),
            endpoint=data["endpoint"],
            generation=int(data["generation"]),
            gpu_count=int(data["gpuCount"]),
            gpu_offset=int(data["gpuOffset"]),
        )


@dataclass(frozen=True)
class UpdateWindow:
    """What start_update_weights answers: engines sorted by cell index, the snapshot, the lock."""

    engines: list[WindowEngine]
    snapshot: dict[str, int]
    lock: LockStatus

    def to_dict(self) -> dict[str, Any]:
        return {
            "engines": [e.to_dict() for e in self.engines],
            "snapshot": dict(self.snapshot),
            "lock": self.lock.to_wire(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UpdateWindow:
        return cls(
            engines=[WindowEngine.from_dict(e) for e in data["engines"]],
            snapshot={str(k): int(v) for k, v in data["snapshot"].items()},
            lock=LockStatus.model_validate(data["lock"]),
        )


def take_snapshot(cells: Iterable[Cell]) -> dict[str, int]:
    """Participants: cells whose engine is up and can take weights (PendingWeights or Serving)."""
    return {c.name: c.generation for c in cells if c.state in UPDATABLE and c.endpoint}


def window_engines(cells: Iterable[Cell], snapshot: Mapping[str, int], gpus_per_engine: int) -> list[WindowEngine]:
    chosen = sorted((c for c in cells if is_participant(c, snapshot)), key=lambda c: c.index)
    return [
        WindowEngine(
            name=c.name,
            index=c.index,
            endpoint=c.endpoint or "",
            generation=c.generation,
            gpu_count=gpus_per_engine,
            gpu_offset=c.index * gpus_per_engine,
        )
        for c in chosen
    ]


def is_participant(cell: Cell, snapshot: Mapping[str, int]) -> bool:
    """Named by the snapshot and not recreated since."""
    return snapshot.get(cell.name) == cell.generation


def cells_to_serve(cells: Iterable[Cell], snapshot: Mapping[str, int]) -> list[Cell]:
    """end: participants still able to serve get the new weights' version and join serving."""
    return [c for c in cells if is_participant(c, snapshot) and c.state in UPDATABLE]


def cells_to_stop(cells: Iterable[Cell], snapshot: Mapping[str, int]) -> list[Cell]:
    """abort: participants that may hold half-updated weights (already Unhealthy ones heal anyway)."""
    return [c for c in cells if is_participant(c, snapshot) and c.state in LOADED]


def dead_at_abort(
    cells: Iterable[Cell],
    observed: Mapping[str, CellObservation] | None,
    unreachable: Mapping[str, str],
) -> dict[str, str]:
    """abort: the stopped cells whose engine is known dead, and why.

    An abort recreates its participants uncharged: they may hold half-updated weights, which is
    the window's fault, not theirs. A participant that died inside the window (a step takes
    seconds, a window a fraction of one, so a crash lands there often) is another matter: left
    uncharged, an engine that crashes in every window would be recreated forever, out of its
    restart budget's reach. Only conclusive evidence counts: its pods failed, restarted or gone
    (`observed`: the platform's cells, None when that read failed), or nothing listening on its
    port (`unreachable`: a refused probe). A slow answer is not conclusive (an engine loading
    weights may be slow) and leaves the cell uncharged.
    """
    dead: dict[str, str] = {}
    for cell in cells:
        obs = None if observed is None else observed.get(cell.name)
        if observed is not None and (obs is None or obs.generation < cell.generation):
            dead[cell.name] = "the cell's pods are gone"
        elif obs is not None and obs.generation == cell.generation and (
            obs.any_failed or obs.restarts > cell.pod_restarts
        ):
            dead[cell.name] = "pod failed or restarted: " + obs.failures()
        elif cell.name in unreachable:
            dead[cell.name] = unreachable[cell.name]
    return dead
