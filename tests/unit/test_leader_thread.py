"""The Lease rounds on their own thread and loop (`leader_thread`): a busy operator loop no longer
costs the Lease. At 1,000 RLJobs the rounds, on the operator's loop, reached the API server 4-8 s
apart instead of every 2 s and the replica gave up leading at its renew deadline, although each
renewal took the API server 10-50 ms."""

from __future__ import annotations

import asyncio
import time

from rljob_operator.leader import LeaderElector
from rljob_operator.leader_thread import ElectorThread

from tests.unit.test_leader import MemoryLeaseStore


def busy(seconds: float) -> None:
    """Keep the calling thread (and its event loop) computing: a loop too busy for its other tasks,
    holding the GIL but for the interpreter's switch intervals (fault injection, not a wait)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def test_the_lease_is_renewed_while_the_operators_loop_is_blocked_past_the_renew_deadline():
    store = MemoryLeaseStore()
    loop = asyncio.get_running_loop()
    lost = asyncio.Event()

    async def on_stopped() -> None:
        loop.call_soon_threadsafe(lost.set)

    elector = LeaderElector(store, "a", lease_duration=3, renew_deadline=2, retry_period=0.1,
                            on_stopped_leading=on_stopped)  # fmt: skip
    election = ElectorThread(elector)
    try:
        await election.call(elector.tick())
        assert elector.is_leader()
        election.start()
        version = store.version
        busy(2.5)  # the operator's loop busy past the renew deadline
        assert store.version > version + 5, "the rounds went on while the loop was blocked"
        assert elector.is_leader()
        await asyncio.sleep(0)  # whatever the election handed to this loop runs now
        assert not lost.is_set()
    finally:
        await election.stop()
        await election.call(elector.release())
        election.close()
    assert store.record is not None and store.record.holder is None, "released on a clean stop"


async def test_on_the_operators_own_loop_the_same_block_lost_the_lease():
    """The old wiring, for contrast: the rounds on the blocked loop itself."""
    store = MemoryLeaseStore()
    elector = LeaderElector(store, "a", lease_duration=3, renew_deadline=2, retry_period=0.1)
    await elector.tick()
    stop = asyncio.Event()
    rounds = asyncio.create_task(elector.run(stop))
    try:
        busy(2.5)
        assert not elector.is_leader()
    finally:
        stop.set()
        await rounds
