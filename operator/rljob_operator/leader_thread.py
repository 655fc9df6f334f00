"""The leader election's rounds on a thread and event loop of their own.

On the operator's event loop, the Lease rounds wait their turn behind everything else the loop
runs: every job's passes, probes and watch events. A large fleet keeps that loop busy enough
that rounds start late and the replica gives up the Lease at its renew deadline although the
API server answers each renewal quickly: a busy loop, not a dead replica. client-go runs leader
election on a goroutine of its own for the same reason. Here the rounds run on their own loop in
a daemon thread, with the Lease's own client and pool thread (`main`); the GIL still is shared,
but a thread waiting for it gets it within a few switch intervals (milliseconds), where a task
waits for every callback queued ahead of it on the loop.

What crosses threads: `LeaderElector.is_leader()` and `leader` are read from the operator's
loop (plain attribute reads); the leading callbacks are the caller's own, called on the
election's loop, and must hand over to their loop themselves (`call_soon_threadsafe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from rljob_operator.leader import LeaderElector

T = TypeVar("T")


class ElectorThread:
    """Runs `elector` on its own event loop in a daemon thread."""

    def __init__(self, elector: LeaderElector) -> None:
        self.elector = elector
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="leader-election", daemon=True)
        self._stop: asyncio.Event | None = None
        self._rounds: Future[None] | None = None
        self._thread.start()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the election's loop and wait for it from the caller's loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def start(self) -> None:
        """Start the rounds (one every retry period) until `stop`."""
        self._rounds = asyncio.run_coroutine_threadsafe(self._run(), self._loop)

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        await self.elector.run(self._stop)

    async def stop(self) -> None:
        """End the rounds (the one in flight finishes); `close` ends the loop and its thread."""
        if self._rounds is not None:
            stop = self._stop
            if stop is not None:
                self._loop.call_soon_threadsafe(stop.set)
            else:  # not begun yet
                self._rounds.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wrap_future(self._rounds)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
