"""Kubernetes Events for an RLJob, written off the hot path.

The controller reports `ControllerEvent`s through a synchronous callback while it holds its
mutex; posting an Event is an API call, so events are queued here and a background task
writes them in order. A full queue drops the oldest-first overflow (logged) rather than
stalling reconciliation: Events are for people, `status` is the record.

While the job's status write is out, its Events wait (`held`): a controller API verb answers
only after its status write, and unheld nearly every such write would be in flight beside the
POST of the Event the same verb had just queued, the API server serving both at once. Held,
the Event goes out after the write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from controller_runtime.clock import Clock, RealClock
from controller_runtime.events import ControllerEvent

log = logging.getLogger(__name__)


class EventSink(Protocol):
    async def create_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str, now: float, action: str = "Reconcile"
    ) -> None: ...


@dataclass(frozen=True)
class PendingEvent:
    type: str
    reason: str
    message: str


def from_controller(event: ControllerEvent) -> PendingEvent:
    where = f"[{event.cell}] " if event.cell else ""
    return PendingEvent(event.type, event.reason, f"{where}{event.message}")


class EventRecorder:
    def __init__(self, sink: EventSink, involved: dict[str, Any], clock: Clock | None = None, maxsize: int = 1000) -> None:
        self.sink = sink
        self.involved = involved
        self.clock = clock or RealClock()
        self._queue: asyncio.Queue[PendingEvent] = asyncio.Queue(maxsize=maxsize)
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self._holds = 0
        self._open = asyncio.Event()
        self._open.set()

    def record(self, type_: str, reason: str, message: str) -> None:
        try:
            self._queue.put_nowait(PendingEvent(type_, reason, message))
        except asyncio.QueueFull:
            log.warning("event queue full; dropping %s %s", reason, message)

    def controller_event(self, event: ControllerEvent) -> None:
        e = from_controller(event)
        self.record(e.type, e.reason, e.message)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Queued Events are not written until every `held` block has ended (they may overlap: a
        pass's status write and a verb's, each held while it waits for the writer's lock)."""
        self._holds += 1
        self._open.clear()
        try:
            yield
        finally:
            self._holds -= 1
            if self._holds == 0:
                self._open.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name=f"events-{self.involved.get('name')}")

    async def _drain(self) -> None:
        while True:
            e = await self._queue.get()
            await self._open.wait()
            try:
                await self.sink.create_event(self.involved, e.type, e.reason, e.message, self.clock.now())
                self.written += 1
            except Exception as exc:
                log.warning("could not write event %s: %r", e.reason, exc)
            finally:
                self._queue.task_done()

    async def flush(self, within: float = 5.0) -> None:
        if self._task is None:
            return  # not started: nothing drains the queue
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._queue.join()

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
