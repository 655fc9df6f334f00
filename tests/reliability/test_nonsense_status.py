"""A status edited by hand into nonsense is repaired, not trusted.

The operator rebuilds its controller from `RLJob.status` whenever it starts (restart,
failover), so the status is input: anyone with `patch` on `rljobs/status` can write into it.
Faults, each written into the status a fresh controller restores from: a window lock held by
nobody that claims to expire in ten years (or to have been taken in the future), a cell the
spec never asked for, and a cell whose generation is far ahead of its pods. Expectation: the
lock lasts no longer than `lockTimeoutSeconds` from its start as the spec bounds it, the
unknown cell is dropped, the cell's pods are never doubled and its recorded generation
follows what exists, and the restored controller keeps serving windows.
"""

from __future__ import annotations

from typing import Any

from controller_runtime.api import RLJobStatus
from controller_runtime.clock import iso
from controller_runtime.events import Reason
from controller_runtime.fakes import settle
from tests.unit.test_controller import JOB, harness, serve

TEN_YEARS = 10 * 365 * 86400


def edited_status(h: Any, **fields: Any) -> RLJobStatus:
    wire = h.ctrl.status_patch()
    wire.update(fields)
    return RLJobStatus.model_validate(wire)


def nobody_lock(since: float, expires: float, snapshot: dict[str, int]) -> dict[str, Any]:
    return {"holder": "nobody", "since": iso(since), "expires": iso(expires), "snapshot": snapshot}


async def test_a_lock_claiming_ten_years_lasts_only_the_specs_timeout() -> None:
    h = harness(2)
    snapshot = await serve(h)
    now = h.clock.now()
    h2 = h.new_controller(restore=edited_status(h, lock=nobody_lock(now, now + TEN_YEARS, snapshot)))
    assert h2.lock.current is not None and h2.lock.current.expires <= now + 600
    await h.clock.advance(601)
    await h2.reconcile()
    assert h2.lock.current is None and Reason.LockExpired in h.reasons()
    await h.clock.advance(10)  # the expired window's participants are recreated after their backoff
    await settle(h2, passes=4)
    window = await h2.start_update_weights("trainer")  # the job is usable again
    assert await h2.end_update_weights(window.snapshot, "2") == sorted(snapshot)


async def test_a_lock_taken_in_the_future_is_bounded_from_now() -> None:
    h = harness(1)
    snapshot = await serve(h)
    now = h.clock.now()
    h2 = h.new_controller(
        restore=edited_status(h, lock=nobody_lock(now + TEN_YEARS, now + 2 * TEN_YEARS, snapshot))
    )
    assert h2.lock.current is not None and h2.lock.current.expires <= now + 600


async def test_an_unknown_cell_is_dropped_and_a_wrong_generation_does_not_double_pods() -> None:
    h = harness(2)
    await serve(h)
    wire = h.ctrl.status_patch()
    engines = wire["engines"]
    ghost = {**engines[1], "name": f"{JOB}-cell-9", "index": 9}
    engines[0] = {**engines[0], "generation": 41}
    h2 = h.new_controller(restore=edited_status(h, engines=[*engines, ghost]))
    await settle(h2, passes=4)
    await h.clock.advance(60)
    await settle(h2, passes=4)
    names = [e["name"] for e in h2.status_patch()["engines"]]
    assert names == [f"{JOB}-cell-0", f"{JOB}-cell-1"], names
    live = {n: c.request.generation for n, c in h.platform.cells.items()}
    assert set(live) == {f"{JOB}-cell-0", f"{JOB}-cell-1"}  # one live generation per cell, nothing for cell 9
    assert h2.fleet.cells[f"{JOB}-cell-0"].generation == live[f"{JOB}-cell-0"]
