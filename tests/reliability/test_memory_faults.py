"""An engine that fails `offload` or `onload`: reported, and never a cell left Offloaded for good.

Faults (the fake engine raises on `release_memory` / `resume_memory`, as an engine answering
500 or garbage does through the real client): offload refused by one cell; onload refused by
one cell. Expectation: the answer names the failed cell and why, an Event says so (warning),
and the status shows it; a cell whose onload failed cannot serve (its weights are gone), so it
is marked Unhealthy and recreated within the restart budget, health monitoring resumes for
the others, and the recreated cell serves after the next weight update, as any new cell does.
"""

from __future__ import annotations

from controller_runtime.cells import CellState as S
from controller_runtime.events import Reason
from controller_runtime.fakes import settle
from tests.unit.test_controller import harness, serve


async def test_refused_offload_is_reported_and_the_cell_keeps_serving() -> None:
    h = harness(2)
    await serve(h)
    h.ctrl.memory.flush_retries = 1
    h.engine(1).fail.add("release_memory")
    change = await h.ctrl.offload(["weights"])
    assert list(change.failed) == ["demo-cell-1"] and "release_memory refused" in change.failed["demo-cell-1"]
    assert h.states() == [S.Offloaded, S.Serving]
    warning = [e for e in h.events if e.reason == Reason.Offloaded]
    assert warning and warning[-1].warning and "failed on ['demo-cell-1']" in warning[-1].message


async def test_refused_onload_marks_the_cell_unhealthy_and_it_is_recreated() -> None:
    h = harness(2)
    await serve(h)
    await h.ctrl.offload(["weights"])
    assert h.states() == [S.Offloaded, S.Offloaded] and not h.ctrl.health.active
    h.engine(1).fail.add("resume_memory")
    change = await h.ctrl.onload(["weights"])
    assert list(change.failed) == ["demo-cell-1"]
    assert h.states() == [S.Serving, S.Unhealthy] and "onload failed" in h.cell(1).message
    assert h.ctrl.health.active, "monitoring resumes: no cell holds released memory any more"
    status = {e["name"]: e for e in h.ctrl.status_patch()["engines"]}
    assert status["demo-cell-1"]["state"] == "Unhealthy" and not status["demo-cell-1"].get("memory")
    await h.clock.advance(10)  # past the restart backoff
    await settle(h.ctrl, passes=4)
    assert h.cell(1).generation == 1 and h.cell(1).state is S.PendingWeights and h.cell(1).restarts == 1
    window = await h.ctrl.start_update_weights("trainer")
    assert await h.ctrl.end_update_weights(window.snapshot, "2") == ["demo-cell-0", "demo-cell-1"]
