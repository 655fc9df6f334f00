"""EventRecorder: Events are written in order off the caller's path, and wait while held."""

from __future__ import annotations

import asyncio
from typing import Any

from rljob_operator.event_recorder import EventRecorder

INVOLVED = {"kind": "RLJob", "namespace": "ns", "name": "job"}


class Sink:
    def __init__(self) -> None:
        self.written: list[str] = []

    async def create_event(self, involved: dict[str, Any], type_: str, reason: str, message: str, now: float,
                           action: str = "Reconcile") -> None:
        self.written.append(reason)


async def let_tasks_run(rounds: int = 20) -> None:
    """Give the drain task every chance to write what it may (a negative check needs it)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_events_are_written_in_order_by_the_background_task():
    sink = Sink()
    rec = EventRecorder(sink, INVOLVED)
    rec.start()
    for reason in ("A", "B", "C"):
        rec.record("Normal", reason, reason.lower())
    await rec.flush()
    assert sink.written == ["A", "B", "C"]
    await rec.close()


async def test_events_queued_while_held_wait_until_every_overlapping_hold_has_ended():
    sink = Sink()
    rec = EventRecorder(sink, INVOLVED)
    rec.start()
    first = rec.held()
    first.__enter__()
    with rec.held():
        rec.record("Normal", "Queued", "during two holds")
        first.__exit__(None, None, None)  # the holds overlap, not nest: the other one still holds
        await let_tasks_run()
        assert sink.written == []
    await rec.flush()
    assert sink.written == ["Queued"]
    rec.record("Normal", "After", "no hold")
    await rec.flush()
    assert sink.written == ["Queued", "After"]
    await rec.close()


async def test_a_hold_ended_by_an_exception_lets_the_events_go():
    sink = Sink()
    rec = EventRecorder(sink, INVOLVED)
    rec.start()
    try:
        with rec.held():
            rec.record("Warning", "Failed", "x")
            raise RuntimeError("the status write failed")
    except RuntimeError:
        pass
    await rec.flush()
    assert sink.written == ["Failed"]
    await rec.close()
