"""Engine choice for generation: per-engine concurrency, least-loaded first, cool-down after failures."""

from __future__ import annotations

import asyncio

import pytest
from rollout_executor.generation import EnginePool, GenerationError, WeightGate, static_endpoints


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_least_loaded_engine_within_concurrency() -> None:
    pool = EnginePool(static_endpoints(["http://a", "http://b"]), concurrency=2, clock=Clock())
    got = [await pool.acquire() for _ in range(4)]
    assert sorted(got) == ["http://a", "http://a", "http://b", "http://b"]
    waiter = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done(), "all slots taken: the fifth request waits"
    await pool.release("http://b", ok=True)
    assert await asyncio.wait_for(waiter, 5) == "http://b"


async def test_failed_engine_cools_down_and_retry_prefers_another() -> None:
    clock = Clock()
    pool = EnginePool(static_endpoints(["http://a", "http://b"]), concurrency=4, clock=clock)
    url = await pool.acquire()
    await pool.release(url, ok=False)
    other = "http://b" if url == "http://a" else "http://a"
    assert {await pool.acquire() for _ in range(3)} == {other}, "the failed engine is cooling down"
    clock.t += 60
    assert await pool.acquire(exclude={other}) == url, "after the cool-down it serves again"


async def test_no_engine_at_all_is_an_error_after_the_deadline() -> None:
    async def none() -> list[str]:
        return []

    pool = EnginePool(none, concurrency=1, no_engine_timeout_seconds=0.2, refresh_seconds=0.05)
    with pytest.raises(GenerationError, match="no serving engine"):
        await pool.acquire()


async def test_gate_abort_cancels_in_flight_and_drain_waits() -> None:
    gate = WeightGate()
    slow = asyncio.ensure_future(asyncio.sleep(30))
    gate.track(slow)
    aborted: list[bool] = []
    slow.add_done_callback(lambda f: (aborted.append(gate.was_aborted(f)), gate.untrack(f)))
    assert await asyncio.wait_for(gate.close("abort"), 5) == 1
    assert slow.cancelled() and aborted == [True], "the request was cancelled by the weight update"
    assert not gate.is_open
    gate.open(3)
    assert gate.is_open and gate.version == 3
    quick = asyncio.ensure_future(asyncio.sleep(0.05))
    gate.track(quick)
    quick.add_done_callback(gate.untrack)
    assert await asyncio.wait_for(gate.close("drain"), 5) == 1
    assert quick.done() and not quick.cancelled(), "drain lets it finish"
    gate.open(4)
    with pytest.raises(ValueError, match="onWeightUpdate"):
        await gate.close("pause")
    assert gate.is_open, "a bad mode leaves generation running"
