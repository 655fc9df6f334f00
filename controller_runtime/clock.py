"""Time as a port, so health checks, backoff and lock expiry are testable with a fake clock."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds (monotonic for scheduling; real clocks may use wall time)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when a test calls `advance`; sleepers wake in order."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + max(0.0, seconds), next(self._seq), fut))
        await fut

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper due, and let woken tasks run."""
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            when, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, when)
            if not fut.done():
                fut.set_result(None)
            for _ in range(10):
                await asyncio.sleep(0)
        self._now = target
        for _ in range(10):
            await asyncio.sleep(0)


async def sleep_or_stop(stop: asyncio.Event, seconds: float, clock: Clock | None = None) -> bool:
    """Sleep `seconds` on `clock` (real time by default) or until `stop` is set, whichever is
    first; True when stopped. The one way every loop here waits, so that a shutdown never
    waits out a timer and a fake clock drives every timer in tests."""
    if stop.is_set():
        return True
    stopper = asyncio.ensure_future(stop.wait())
    timer = asyncio.ensure_future((clock or RealClock()).sleep(max(seconds, 0.0)))
    try:
        await asyncio.wait({stopper, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        timer.cancel()
    return stop.is_set()


async def ticks(
    stop: asyncio.Event, period: float, clock: Clock | None = None, *, at_once: bool = True
) -> AsyncGenerator[None, None]:
    """Yield every `period` seconds (at once first unless `at_once` is false) until `stop` is
    set. For the operator-wide loops that run while it is idle (the leader's renewals, the
    relist): their wait tasks live through the work done at each tick, the stop-waiter for the
    whole loop and each period's timer armed before its tick, so the idle operator's task count
    (rljob_operator_asyncio_tasks, which the soak and the leak test read) does not dip while a
    tick's API call is in flight, and a tick that is slow does not push the next one later.
    Use under `contextlib.aclosing`, so a loop that breaks out cancels the waits at once."""
    clock = clock or RealClock()
    stopped = asyncio.ensure_future(stop.wait())
    timer: asyncio.Future[None] | None = None
    try:
        if not at_once:
            timer = asyncio.ensure_future(clock.sleep(max(period, 0.0)))
            await asyncio.wait({timer, stopped}, return_when=asyncio.FIRST_COMPLETED)
        while not stop.is_set():
            timer = asyncio.ensure_future(clock.sleep(max(period, 0.0)))
            await asyncio.sleep(0)  # the timer starts (takes its deadline) before the round does
            yield
            if not stop.is_set():
                await asyncio.wait({timer, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if timer is not None:
            timer.cancel()


def iso(ts: float) -> str:
    """RFC 3339 UTC, as Kubernetes writes times."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
