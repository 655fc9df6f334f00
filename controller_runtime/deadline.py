"""Bounding an engine call by the controller's clock, so a hanging engine costs at most a timeout.

`asyncio.wait_for` measures the event loop's time; racing the call against `Clock.sleep`
instead gives the same bound under `RealClock` and a deterministic one under `FakeClock`
(tests advance time instead of sleeping).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from controller_runtime.clock import Clock

T = TypeVar("T")


async def call_within(clock: Clock, call: Awaitable[T], seconds: float) -> T:
    """Await `call`; after `seconds` on `clock` cancel it and raise TimeoutError."""
    task = asyncio.ensure_future(call)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        done, _ = await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        timer.cancel()
    if task in done:
        return task.result()
    # Do not await the cancelled call: an engine client that ignores cancellation must not
    # turn a bounded probe back into a hang.
    task.cancel()
    task.add_done_callback(_consume)
    raise TimeoutError(f"no answer within {seconds:g} s")


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
