"""Health checking: threshold, reset, epochs, initial delay, startup deadline, hanging engines."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controller_runtime.api.spec import HealthCheckSpec
from controller_runtime.api.status import CellState
from controller_runtime.cells import Cell
from controller_runtime.clock import FakeClock
from controller_runtime.fakes import FakeEngine
from controller_runtime.health import STARTING_PROBE_SECONDS, HealthMonitor, Verdict

S = CellState


def monitor(clock: FakeClock, **kw: float) -> HealthMonitor:
    spec = HealthCheckSpec(**{"interval_seconds": 10, "timeout_seconds": 5, "failure_threshold": 3, **kw})
    return HealthMonitor(spec, clock)


def serving_cell() -> Cell:
    return Cell("j-cell-0", 0, state=S.Serving, endpoint="http://e")


async def until(predicate: Callable[[], bool]) -> None:
    """Let other tasks run until `predicate` holds (bounded: fails rather than hangs)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def probe_and_record(m: HealthMonitor, cell: Cell, engine: FakeEngine) -> Verdict:
    return m.record(cell, await m.probe(cell, engine))


async def test_threshold_of_consecutive_failures_makes_a_cell_unhealthy() -> None:
    clock = FakeClock()
    m, cell, engine = monitor(clock), serving_cell(), FakeEngine("http://e", healthy=False)
    assert await probe_and_record(m, cell, engine) == Verdict.failing
    assert await probe_and_record(m, cell, engine) == Verdict.failing
    assert await probe_and_record(m, cell, engine) == Verdict.unhealthy
    assert cell.consecutive_failures == 3
    assert cell.last_probe_time == clock.now()


async def test_one_success_resets_the_failure_count() -> None:
    m, cell, engine = monitor(FakeClock()), serving_cell(), FakeEngine("http://e", healthy=False)
    await probe_and_record(m, cell, engine)
    await probe_and_record(m, cell, engine)
    engine.healthy = True
    assert await probe_and_record(m, cell, engine) == Verdict.healthy
    assert cell.consecutive_failures == 0
    engine.healthy = False
    assert await probe_and_record(m, cell, engine) == Verdict.failing


async def test_garbage_answer_counts_as_a_failure() -> None:
    m, cell = monitor(FakeClock(), failure_threshold=1), serving_cell()
    outcome = await m.probe(cell, FakeEngine("http://e", garbage=True))
    assert not outcome.ok and "EngineProtocolError" in outcome.error
    assert m.record(cell, outcome) == Verdict.unhealthy


async def test_hanging_engine_fails_when_the_timeout_elapses() -> None:
    clock = FakeClock()
    m, cell, engine = monitor(clock, timeout_seconds=5), serving_cell(), FakeEngine("http://e", hang=True)
    task = asyncio.create_task(m.probe(cell, engine))
    await until(lambda: engine.health_started == 1)
    await clock.advance(4.9)
    assert not task.done()
    await clock.advance(0.2)
    outcome = await asyncio.wait_for(task, 1)  # real-time guard: the fake clock must have ended it
    assert not outcome.ok and "timed out after 5 s" in outcome.error


async def test_probe_started_before_pause_and_answered_after_resume_is_discarded() -> None:
    clock = FakeClock()
    m, cell = monitor(clock, failure_threshold=1), serving_cell()
    engine = FakeEngine("http://e", healthy=False, health_gate=asyncio.Event())
    task = asyncio.create_task(m.probe(cell, engine))
    await until(lambda: engine.health_started == 1)
    m.pause("offload")
    m.resume("offload")
    engine.health_gate.set()
    outcome = await task
    assert not outcome.ok
    assert m.record(cell, outcome) == Verdict.discarded
    assert cell.consecutive_failures == 0 and cell.state == S.Serving


async def test_probe_for_an_older_generation_is_discarded() -> None:
    m, cell = monitor(FakeClock(), failure_threshold=1), serving_cell()
    outcome = await m.probe(cell, FakeEngine("http://e", healthy=False))
    cell.generation += 1
    assert m.record(cell, outcome) == Verdict.discarded


async def test_initial_delay_is_re_armed_on_every_resume() -> None:
    clock = FakeClock()
    m, cell = monitor(clock, initial_delay_seconds=30), serving_cell()
    m.arm(cell.name)
    assert not m.is_due(cell.name)
    await clock.advance(30)
    assert m.is_due(cell.name)
    m.pause("window")
    assert not m.wants_probe(cell)
    await clock.advance(100)
    m.resume("window")
    assert m.wants_probe(cell)
    assert not m.is_due(cell.name)
    assert m.seconds_until_due(cell.name) == 30
    await clock.advance(30)
    assert m.is_due(cell.name)


async def test_monitoring_stays_paused_until_every_reason_is_cleared() -> None:
    m = monitor(FakeClock())
    m.pause("offload")
    m.pause("window")
    epoch = m.epoch
    m.resume("window")
    assert not m.active and m.epoch == epoch + 1
    m.resume("offload")
    assert m.active
    m.resume("offload")  # resuming what is not paused changes nothing
    assert m.epoch == epoch + 2


async def test_starting_cells_are_probed_even_while_paused_and_their_failures_do_not_count() -> None:
    m = monitor(FakeClock(), failure_threshold=1)
    cell = Cell("j-cell-0", 0, state=S.Starting, endpoint="http://e")
    m.pause("offload")
    assert m.wants_probe(cell)
    outcome = await m.probe(cell, FakeEngine("http://e", healthy=False))
    assert m.record(cell, outcome) == Verdict.failing
    assert cell.consecutive_failures == 0


async def test_startup_deadline() -> None:
    clock = FakeClock()
    m = monitor(clock, startup_deadline_seconds=100)
    cell = Cell("j-cell-0", 0, state=S.Starting, endpoint="http://e", created_time=clock.now())
    await clock.advance(99)
    assert not m.startup_expired(cell)
    await clock.advance(1)
    assert m.startup_expired(cell)
    cell.state = S.PendingWeights
    assert not m.startup_expired(cell)


async def test_probes_are_scheduled_every_interval() -> None:
    clock = FakeClock()
    m, cell = monitor(clock, interval_seconds=10), serving_cell()
    assert m.is_due(cell.name)
    await m.probe(cell, FakeEngine("http://e"))
    assert not m.is_due(cell.name)
    await clock.advance(10)
    assert m.is_due(cell.name)


async def test_a_starting_cell_is_probed_every_second_a_loaded_one_every_interval() -> None:
    """A replacement becomes PendingWeights on its first answer; probed only every intervalSeconds
    it would wait up to a whole interval (30 s by default) after it started listening."""
    clock = FakeClock()
    m, engine = monitor(clock, interval_seconds=30), FakeEngine("http://e", healthy=False)
    starting = Cell("j-cell-1", 1, state=S.Starting, endpoint="http://e")
    await probe_and_record(m, starting, engine)
    assert m.seconds_until_due(starting.name) == STARTING_PROBE_SECONDS
    serving = serving_cell()
    await probe_and_record(m, serving, engine)
    assert m.seconds_until_due(serving.name) == 30
