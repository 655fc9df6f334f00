"""Offload and onload: releasing and taking back the policy fleet's engine memory.

A colocated trainer needs the GPUs between rollouts, so it asks the engines to release their
KV cache and/or weights (`MemoryTag`) and later to take them back. Decisions worth knowing:

- Only policy cells are touched; the eval fleet keeps its pinned checkpoint.
- A cell whose weights are released is Offloaded (out of the serving set) and remembers the
  state it left; when its weights come back it returns there, except that a Serving cell that
  slept through a weight update comes back PendingWeights (it would serve stale weights).
- Health monitoring pauses from the first offload until nothing is released any more (or a
  rollout is prepared): an engine without memory does not answer like a healthy one.
- A refusing engine fails only its own cell: the answer (`MemoryChange`) says which cells
  changed and which failed and why, and the operation as a whole never raises for it.

The caller holds the fleet's mutex and has already refused the call if a window is open.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from controller_runtime.api.spec import MemoryTag
from controller_runtime.api.status import CellState
from controller_runtime.cells import UPDATABLE, Cell
from controller_runtime.errors import EngineError
from controller_runtime.events import Reason
from controller_runtime.fleet import Fleet
from controller_runtime.health import HealthMonitor

log = logging.getLogger(__name__)

PAUSE_OFFLOAD = "offload"  # the health monitor's pause reason while memory is released
S = CellState


@dataclass(frozen=True)
class MemoryChange:
    """What offload/onload did: tags per cell, and the cells whose engine refused."""

    cells: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"cells": self.cells, "failed": self.failed}


def memory_tags(tags: Iterable[MemoryTag | str]) -> list[MemoryTag]:
    """Validated, de-duplicated, in canonical order."""
    wanted = {MemoryTag(t) for t in tags}
    return [t for t in MemoryTag if t in wanted]


class FleetMemory:
    def __init__(self, fleet: Fleet, health: HealthMonitor, *, flush_retries: int = 60,
                 flush_retry_seconds: float = 1.0) -> None:
        self.fleet = fleet
        self.health = health
        # An engine refuses to release memory while requests are in flight: retry the flush.
        self.flush_retries = flush_retries
        self.flush_retry_seconds = flush_retry_seconds

    def any_released(self) -> bool:
        return any(c.memory for c in self.fleet.cells.values())

    async def offload(self, wanted: list[MemoryTag]) -> MemoryChange:
        """Release `wanted` on every PendingWeights/Serving/Offloaded cell that still holds one."""
        self.health.pause(PAUSE_OFFLOAD)
        targets = [c for c in self.fleet.policy()
                   if c.endpoint and (c.state in UPDATABLE or c.state is S.Offloaded)
                   and any(t not in c.memory for t in wanted)]
        results = await asyncio.gather(*(self._offload_cell(c, wanted) for c in targets), return_exceptions=True)
        change = _memory_change(targets, results)
        await self.fleet.sync_serving_all(targets)
        self.fleet.record("offload", tags=[str(t) for t in wanted], **change.to_dict())
        self.fleet.emit(Reason.Offloaded, f"released {', '.join(map(str, wanted))} on {_cells_moved(change)}"
                        + (f"; failed on {sorted(change.failed)}" if change.failed else ""),
                        warning=bool(change.failed))
        return change

    async def _offload_cell(self, cell: Cell, tags: list[MemoryTag]) -> list[str]:
        client = self.fleet.client(cell)
        release = [t for t in tags if t not in cell.memory]
        for attempt in range(self.flush_retries):
            try:
                await self.fleet.engine_call(client.flush_cache())
                break
            except EngineError as exc:
                if attempt + 1 >= self.flush_retries:
                    raise
                log.info("flush_cache on %s: %s; retrying", cell.name, exc)
                await self.fleet.clock.sleep(self.flush_retry_seconds)
        await self.fleet.engine_call(client.release_memory(release))
        cell.memory = tuple(t for t in MemoryTag if t in cell.memory or t in release)
        if MemoryTag.weights in release and cell.state is not S.Offloaded:
            cell.state_before_offload = cell.state
            self.fleet.move(cell, S.Offloaded, "weights released", announce=False)
        return [str(t) for t in release]

    async def onload(self, wanted: list[MemoryTag]) -> MemoryChange:
        """Take `wanted` back; when the weights are back, a cell returns to its state before offload."""
        targets = [c for c in self.fleet.policy() if c.endpoint and any(t in c.memory for t in wanted)]
        results = await asyncio.gather(*(self._onload_cell(c, wanted) for c in targets), return_exceptions=True)
        change = _memory_change(targets, results)
        for cell in targets:
            if cell.name in change.failed:
                self._give_up_memory(cell, change.failed[cell.name])
        await self.fleet.sync_serving_all(targets)
        if not self.any_released():
            self.health.resume(PAUSE_OFFLOAD)
        self.fleet.record("onload", tags=[str(t) for t in wanted], **change.to_dict())
        self.fleet.emit(Reason.Onloaded, f"resumed {', '.join(map(str, wanted))} on {_cells_moved(change)}"
                        + (f"; failed on {sorted(change.failed)}" if change.failed else ""),
                        warning=bool(change.failed))
        return change

    def _give_up_memory(self, cell: Cell, why: str) -> None:
        """A cell whose engine refused to take its memory back cannot serve (weights or KV cache
        gone): left as it is it would stay Offloaded and hold health monitoring paused for the
        whole fleet, for good. It becomes Unhealthy and is recreated within the restart budget
        (a new engine holds all of its memory)."""
        cell.memory = ()
        cell.state_before_offload = None
        if cell.state not in (S.Unhealthy, S.Failed):
            self.fleet.move(cell, S.Unhealthy, f"onload failed: {why}", warning=True)
            self.health.forget(cell.name)

    async def _onload_cell(self, cell: Cell, tags: list[MemoryTag]) -> list[str]:
        resume = [t for t in tags if t in cell.memory]
        await self.fleet.engine_call(self.fleet.client(cell).resume_memory(resume))
        cell.memory = tuple(t for t in cell.memory if t not in resume)
        if cell.state is S.Offloaded and MemoryTag.weights not in cell.memory:
            back = cell.state_before_offload or S.PendingWeights
            cell.state_before_offload = None
            version = self.fleet.weight_version
            if back is S.Serving and cell.weight_version != version:
                # It slept through a weight update: serving again would serve stale weights.
                self.fleet.move(cell, S.PendingWeights, f"weights onloaded at {cell.weight_version}, fleet is at {version}",
                                announce=False)
            else:
                self.fleet.move(cell, back, "weights onloaded", announce=False)
        return [str(t) for t in resume]


def _cells_moved(change: MemoryChange) -> str:
    """The one Event of an offload/onload names its cells (their moves are not announced one by one)."""
    names = sorted(change.cells)
    return f"{len(names)} cells" + (f" ({', '.join(names)})" if names else "")


def _memory_change(cells: list[Cell], results: Iterable[list[str] | BaseException]) -> MemoryChange:
    change = MemoryChange()
    for cell, result in zip(cells, results, strict=True):
        if isinstance(result, BaseException):
            change.failed[cell.name] = f"{type(result).__name__}: {result}"
        else:
            change.cells[cell.name] = list(result)
    return change
