"""InferenceController against the in-memory platform and engines, with a fake clock."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controller_runtime.api.spec import (
    EvalFleetSpec,
    HealthCheckSpec,
    InferenceSpec,
    MemoryTag,
    RestartPolicySpec,
    WeightUpdateSpec,
)
from controller_runtime.api.status import CellState, RLJobStatus
from controller_runtime.audit import AuditLog, read_audit_log
from controller_runtime.clock import FakeClock
from controller_runtime.controller import InferenceController
from controller_runtime.errors import LockHeld, NoReadyEngines, SnapshotMismatch, WeightCheckMismatch
from controller_runtime.events import ControllerEvent, Reason
from controller_runtime.fakes import FakeEngine, FakeEngines, FakePlatform, settle
from controller_runtime.health import STARTING_PROBE_SECONDS
from controller_runtime.ports import CellObservation, CellRequest

S = CellState
T = TypeVar("T")
JOB = "demo"


def spec(replicas: int = 2, **kw: Any) -> InferenceSpec:
    return InferenceSpec(
        replicas=replicas,
        gpus_per_engine=kw.pop("gpus_per_engine", 2),
        health_check=HealthCheckSpec(interval_seconds=10, timeout_seconds=5, failure_threshold=2,
                                     startup_deadline_seconds=kw.pop("startup_deadline", 1800),
                                     scheduling_deadline_seconds=kw.pop("scheduling_deadline", 300)),
        restart_policy=RestartPolicySpec(backoff_seconds=5, max_backoff_seconds=300,
                                         max_restarts=kw.pop("max_restarts", 3)),
        weight_update=WeightUpdateSpec(lock_timeout_seconds=600, check_weights=kw.pop("check_weights", False)),
        **kw,
    )


@dataclass
class Harness:
    ctrl: InferenceController
    platform: FakePlatform
    engines: FakeEngines
    clock: FakeClock
    events: list[ControllerEvent] = field(default_factory=list)

    def engine(self, index: int) -> FakeEngine:
        name = f"{JOB}-cell-{index}"
        return self.engines(FakePlatform.endpoint_of(name, self.platform.cells[name].request.generation))

    def cell(self, index: int):
        return self.ctrl.fleet.cells[f"{JOB}-cell-{index}"]

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]

    def states(self) -> list[CellState]:
        return [c.state for c in sorted(self.ctrl.fleet.cells.values(), key=lambda c: c.index)]

    def new_controller(self, **kw: Any) -> InferenceController:
        return InferenceController(JOB, kw.pop("spec", self.ctrl.spec), self.platform, self.engines,
                                   clock=self.clock, on_event=self.events.append, **kw)


def harness(replicas: int = 2, *, serve_initial_weights: bool = False, audit: AuditLog | None = None,
            platform: FakePlatform | None = None, **kw: Any) -> Harness:
    clock = FakeClock()
    s = spec(replicas, **kw)
    h = Harness(None, platform or FakePlatform(pods_per_cell=s.pods_per_cell), FakeEngines(), clock)  # type: ignore[arg-type]
    h.ctrl = InferenceController(JOB, s, h.platform, h.engines, clock=clock, audit=audit,
                                 on_event=h.events.append, serve_initial_weights=serve_initial_weights,
                                 flush_retry_seconds=1.0)
    return h


async def with_clock(clock: FakeClock, call: Awaitable[T], step: float = 1.0) -> T:
    """Run `call`, advancing the fake clock while it sleeps (bounded: fails rather than hangs)."""
    task = asyncio.ensure_future(call)
    for _ in range(10_000):
        if task.done():
            return task.result()
        await clock.advance(step)
    task.cancel()
    raise AssertionError("call did not finish")


async def bring_up(h: Harness) -> None:
    await settle(h.ctrl, passes=3)


async def serve(h: Harness, version: str = "1") -> dict[str, int]:
    await bring_up(h)
    window = await h.ctrl.start_update_weights("trainer")
    await h.ctrl.end_update_weights(window.snapshot, version)
    return window.snapshot


# -- bootstrap ---------------------------------------------------------------------------------


async def test_bootstrap_creates_named_cells_that_wait_for_weights() -> None:
    h = harness(2)
    await bring_up(h)
    assert [(r.name, r.generation) for r in h.platform.created] == [("demo-cell-0", 0), ("demo-cell-1", 0)]
    assert h.states() == [S.PendingWeights, S.PendingWeights]
    assert h.ctrl.serving_endpoints() == []
    assert h.platform.serving == {"demo-cell-0": False, "demo-cell-1": False}
    # created not serving: nothing to relabel (it was a list and a patch per pod, issue 13)
    assert h.platform.serving_calls == []
    patch = h.ctrl.status_patch()
    assert (patch["ready"], patch["readyEngines"], patch["totalEngines"], patch["lock"]) == ("0/2", 0, 2, None)
    await settle(h.ctrl)
    assert len(h.platform.created) == 2  # level-based: more passes create nothing


async def test_a_pod_the_api_server_refused_is_made_again_without_a_restart() -> None:
    """A 2-pod cell whose head the API server refused (a brand-new namespace's ServiceAccount not
    made yet: a scale benchmark met it) used to count as a failed pod: Unhealthy, a restart
    charged, and the replacement waited for a weight update no job had made yet."""
    h = harness(1, gpus_per_engine=16, gpus_per_node=8, serve_initial_weights=True)
    h.platform.refuse_pods = {0}
    with pytest.raises(RuntimeError, match="refused"):
        await h.ctrl.reconcile()
    assert h.ctrl.status_patch()["engines"][0]["state"] == S.Pending
    h.platform.refuse_pods = set()
    await bring_up(h)
    assert (h.cell(0).state, h.cell(0).generation, h.cell(0).restarts) == (S.Serving, 0, 0)
    assert [p.missing for p in h.platform.cells["demo-cell-0"].pods] == [False, False]
    assert Reason.CellUnhealthy not in h.reasons()


async def test_pods_that_stay_missing_end_at_the_startup_deadline_and_a_lost_pod_of_a_started_cell_replaces_it() -> None:
    h = harness(2, gpus_per_engine=16, gpus_per_node=8, startup_deadline=60)
    h.platform.refuse_pods = {1}
    for _ in range(3):
        with pytest.raises(RuntimeError, match="refused"):
            await h.ctrl.reconcile()
    assert h.states() == [S.Pending, S.Pending]
    await h.clock.advance(60)
    await h.ctrl.reconcile()
    assert h.states() == [S.Unhealthy, S.Unhealthy]
    assert "pods still missing after 60 s: demo-cell-0-g0-1 Unknown" in h.cell(0).message
    assert h.reasons().count(Reason.StartupDeadlineExceeded) == 2

    h = harness(1, gpus_per_engine=16, gpus_per_node=8)
    await bring_up(h)
    h.platform.lose_pod("demo-cell-0", 1)
    await h.ctrl.reconcile()
    assert h.cell(0).state is S.Unhealthy  # it ran: the engine group is broken


async def test_a_cell_whose_creates_are_always_refused_ends_at_the_startup_deadline() -> None:
    h = harness(1, startup_deadline=60)
    h.platform.fail_create = True  # a quota that never admits the cell's pods
    for _ in range(2):
        with pytest.raises(RuntimeError, match="create refused"):
            await h.ctrl.reconcile()
    await h.clock.advance(60)
    await h.ctrl.reconcile()
    assert h.cell(0).state is S.Unhealthy
    assert h.reasons()[-1] == Reason.StartupDeadlineExceeded


async def test_pending_to_starting_waits_for_running_pods() -> None:
    h = harness(1, platform=FakePlatform(start_running=False))
    await settle(h.ctrl)
    assert h.states() == [S.Pending]
    h.platform.run_pods("demo-cell-0")
    await settle(h.ctrl, passes=1)
    assert h.states() == [S.PendingWeights]



async def test_a_cell_waiting_for_its_pods_is_polled_only_when_pod_changes_do_not_wake_passes() -> None:
    """A driver without a pod watch (local mode) looks at a Pending cell every
    STARTING_PROBE_SECONDS; one whose pod events wake passes (the operator) is asked for a pass
    only at the poll, or the cell's deadlines."""
    h = harness(1, platform=FakePlatform(start_running=False))
    await settle(h.ctrl)
    assert h.states() == [S.Pending]
    assert await h.ctrl.reconcile() == STARTING_PROBE_SECONDS
    watched = h.new_controller(pods_wake_passes=True, poll_seconds=7.0)
    await settle(watched)
    assert [c.state for c in watched.fleet.cells.values()] == [S.Pending]
    assert await watched.reconcile() == 7.0

async def test_serve_initial_weights_goes_straight_to_serving() -> None:
    h = harness(2, serve_initial_weights=True)
    await bring_up(h)
    assert h.states() == [S.Serving, S.Serving]
    assert h.platform.serving == {"demo-cell-0": True, "demo-cell-1": True}
    assert h.ctrl.status_patch()["ready"] == "2/2"
    assert len(h.ctrl.serving_endpoints()) == 2


async def test_recreated_cell_waits_for_weights_even_with_serve_initial_weights() -> None:
    h = harness(1, serve_initial_weights=True)
    await bring_up(h)
    h.platform.fail_pod("demo-cell-0")
    await h.ctrl.reconcile()
    await h.clock.advance(5)
    await bring_up(h)
    assert (h.cell(0).generation, h.cell(0).state) == (1, S.PendingWeights)
    assert h.platform.serving["demo-cell-0"] is False


async def test_fresh_cells_are_created_serving_where_the_platform_admits_them_when_ready() -> None:
    """Where the platform admits a cell only once its engine answers (Kubernetes: the Service
    lists Ready pods), a generation-0 cell that will serve the initial weights is created
    serving: no label write when it comes up (it was one pod PATCH per cell of every new job,
    4,000 of them in a ramp of 1,000 jobs, issue 13). A recreated cell is created not serving
    and labelled when a window brings it in."""
    h = harness(2, serve_initial_weights=True, platform=FakePlatform(admits_when_ready=True))
    await bring_up(h)
    assert h.states() == [S.Serving, S.Serving]
    assert [(r.name, r.serving) for r in h.platform.created] == [("demo-cell-0", True), ("demo-cell-1", True)]
    assert h.platform.serving == {"demo-cell-0": True, "demo-cell-1": True}
    assert h.platform.serving_calls == []
    h.platform.fail_pod("demo-cell-1")
    await h.ctrl.reconcile()
    assert h.platform.serving_calls == [("demo-cell-1", False)]
    await h.clock.advance(5)
    await bring_up(h)
    assert (h.cell(1).generation, h.cell(1).state, h.platform.created[-1].serving) == (1, S.PendingWeights, False)
    window = await h.ctrl.start_update_weights("trainer")
    await h.ctrl.end_update_weights(window.snapshot, "1")
    assert h.platform.serving_calls == [("demo-cell-1", False), ("demo-cell-1", True)]
    assert h.platform.serving == {"demo-cell-0": True, "demo-cell-1": True}


async def test_a_platform_that_serves_whatever_is_marked_gets_cells_created_not_serving() -> None:
    """A local process is served as soon as it is marked: such a platform never gets a cell
    created serving, and the cell is labelled once its engine answers, as before."""
    h = harness(1, serve_initial_weights=True, platform=FakePlatform(admits_when_ready=False))
    await bring_up(h)
    assert (h.states(), h.platform.created[0].serving) == ([S.Serving], False)
    assert h.platform.serving_calls == [("demo-cell-0", True)]


async def test_a_window_takes_a_starting_cell_created_serving_out_before_it_is_answered() -> None:
    """A cell created serving that still starts when a window opens would join the serving set
    with the initial weights once its engine answers, after the window replaced them: its label
    is written `false` before `start_update_weights` answers, and the cell waits for the next
    update like any late cell."""
    h = harness(2, serve_initial_weights=True, platform=FakePlatform(admits_when_ready=True))
    late = h.engines(FakePlatform.endpoint_of("demo-cell-1", 0))
    late.healthy = False
    await bring_up(h)
    assert h.states() == [S.Serving, S.Starting]
    assert h.platform.serving == {"demo-cell-0": True, "demo-cell-1": True} and h.platform.serving_calls == []
    window = await h.ctrl.start_update_weights("trainer")
    assert window.snapshot == {"demo-cell-0": 0}
    assert h.platform.serving_calls == [("demo-cell-1", False)]
    await h.ctrl.end_update_weights(window.snapshot, "1")
    late.healthy = True
    await with_clock(h.clock, settle(h.ctrl, passes=3))
    assert h.states() == [S.Serving, S.PendingWeights]
    assert h.platform.serving == {"demo-cell-0": True, "demo-cell-1": False}
    assert h.platform.serving_calls == [("demo-cell-1", False)]


class LostAnswerPlatform(FakePlatform):
    """The API server takes a create and its answer is lost (a timeout): the pods exist, and the
    platform's view (a watch behind) does not show them until `hide` is emptied."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.lose: set[str] = set()
        self.hide: set[str] = set()
        self.asked: list[CellRequest] = []  # every create, the ones that found the pods there too

    async def create_cell(self, request: CellRequest) -> None:
        self.asked.append(request)
        await super().create_cell(request)
        if request.name in self.lose:
            self.lose.discard(request.name)
            self.hide.add(request.name)
            raise TimeoutError("the create's answer was lost")

    async def observe_cells(self) -> Sequence[CellObservation]:
        return [o for o in await super().observe_cells() if o.name not in self.hide]


async def test_a_create_whose_answer_was_lost_never_assumes_its_label() -> None:
    """A create that raised may have made the cell's pods, labelled serving as it asked. If a window
    ends before the create is retried, the retry asks for `false` and finds the pods there: the
    label is then not assumed (it was assumed `false`, and the head, still `true`, joined the
    Service with the initial weights once its engine answered); the next sync writes it."""
    platform = LostAnswerPlatform(admits_when_ready=True)
    h = harness(1, serve_initial_weights=True, platform=platform)
    await bring_up(h)
    assert h.states() == [S.Serving]
    h.ctrl.update_spec(spec(2))
    platform.lose.add("demo-cell-1")
    with pytest.raises(TimeoutError):
        await h.ctrl.reconcile()
    assert platform.serving["demo-cell-1"] is True  # made serving; the answer never came
    window = await h.ctrl.start_update_weights("trainer")
    await h.ctrl.end_update_weights(window.snapshot, "1")
    await h.ctrl.reconcile()  # the retry: weights were updated since, so it asks for `false`
    assert [(r.name, r.serving) for r in platform.asked[-2:]] == [("demo-cell-1", True), ("demo-cell-1", False)]
    platform.hide.clear()
    await with_clock(h.clock, settle(h.ctrl, passes=3))
    assert h.states() == [S.Serving, S.PendingWeights]
    assert platform.serving == {"demo-cell-0": True, "demo-cell-1": False}


async def test_scale_up_after_an_update_waits_for_the_next_one() -> None:
    h = harness(1, serve_initial_weights=True)
    await serve(h, "1")
    h.ctrl.update_spec(spec(2))
    await bring_up(h)
    assert h.states() == [S.Serving, S.PendingWeights]


# -- the window --------------------------------------------------------------------------------


async def test_window_serves_participants_at_the_new_version() -> None:
    h = harness(3)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("trainer-0")
    assert [(e.name, e.gpu_count, e.gpu_offset) for e in window.engines] == [
        ("demo-cell-0", 2, 0), ("demo-cell-1", 2, 2), ("demo-cell-2", 2, 4)]
    assert window.snapshot == {"demo-cell-0": 0, "demo-cell-1": 0, "demo-cell-2": 0}
    assert window.lock.holder == "trainer-0"
    assert h.ctrl.status_patch()["lock"]["snapshot"] == window.snapshot
    await h.clock.advance(2.5)
    served = await h.ctrl.end_update_weights(window.snapshot, "7")
    assert served == ["demo-cell-0", "demo-cell-1", "demo-cell-2"]
    assert h.states() == [S.Serving] * 3
    assert {c.weight_version for c in h.ctrl.fleet.cells.values()} == {"7"}
    assert all(h.platform.serving.values())
    assert h.ctrl.status_patch()["weightVersion"] == "7" and h.ctrl.lock.current is None
    updated = [e for e in h.events if e.reason == Reason.WeightsUpdated]
    assert updated and "weights updated to v7 in 2.5 s" in updated[0].message


async def test_second_window_is_refused_while_one_is_open() -> None:
    h = harness(1)
    await bring_up(h)
    await h.ctrl.start_update_weights("a")
    with pytest.raises(LockHeld, match="'a'"):
        await h.ctrl.start_update_weights("b")
    with pytest.raises(LockHeld):
        await h.ctrl.offload()
    with pytest.raises(LockHeld):
        await h.ctrl.onload()
    with pytest.raises(LockHeld):  # issue 10 bug 1: prepare_rollout now waits for the window; 0 s refuses at once
        await h.ctrl.prepare_rollout(1, wait_seconds=0)


async def test_prepare_rollout_waits_for_an_open_window_to_close() -> None:
    """Issue 10 bug 1: a second rank's prepare during the writer's window was refused with LockHeld and the rank died."""
    h = harness(1)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("trainer-0")
    waiting = asyncio.ensure_future(h.ctrl.prepare_rollout(4))
    await h.clock.advance(5.0)
    assert not waiting.done() and h.ctrl.rollout_id is None
    await h.ctrl.end_update_weights(window.snapshot, "1")
    await with_clock(h.clock, waiting, step=0.1)
    assert h.ctrl.rollout_id == 4


async def test_prepare_rollout_gives_up_after_its_wait_naming_the_holder() -> None:
    h = harness(1)
    await bring_up(h)
    await h.ctrl.start_update_weights("trainer-0")
    waiting = asyncio.ensure_future(h.ctrl.prepare_rollout(4, wait_seconds=20))
    await h.clock.advance(19.0)
    assert not waiting.done()
    with pytest.raises(LockHeld, match=r"waited 20 s for the update window of 'trainer-0'"):
        await with_clock(h.clock, waiting)
    assert h.ctrl.rollout_id is None and h.ctrl.lock.current is not None


async def test_window_without_ready_engines_is_refused() -> None:
    h = harness(1, platform=FakePlatform(start_running=False))
    await settle(h.ctrl)
    with pytest.raises(NoReadyEngines):
        await h.ctrl.start_update_weights("t")
    assert h.ctrl.lock.current is None


async def test_wrong_snapshot_is_a_mismatch_and_leaves_the_window_open() -> None:
    h = harness(2)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    with pytest.raises(SnapshotMismatch):
        await h.ctrl.end_update_weights({"demo-cell-0": 0}, "1")
    with pytest.raises(SnapshotMismatch):
        await h.ctrl.abort_update_weights({**window.snapshot, "demo-cell-1": 5})
    assert h.ctrl.lock.current is not None
    await h.ctrl.end_update_weights(window.snapshot, "1")
    with pytest.raises(SnapshotMismatch, match="no update window"):
        await h.ctrl.end_update_weights(window.snapshot, "2")


async def test_a_repeated_end_or_abort_answers_the_first_call_and_changes_nothing() -> None:
    """A call whose effect could not be recorded is repeated by the client: it must not apply twice."""
    h = harness(2)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    served = await h.ctrl.end_update_weights(window.snapshot, "3")
    assert await h.ctrl.end_update_weights(window.snapshot, "3") == served
    assert await h.ctrl.end_update_weights(window.snapshot) == served  # no version: the one it ended at
    assert h.reasons().count(Reason.WeightsUpdated) == 1 and h.ctrl.fleet.weight_version == "3"
    with pytest.raises(SnapshotMismatch):  # an abort never repeats an end
        await h.ctrl.abort_update_weights(window.snapshot)
    window = await h.ctrl.start_update_weights("t")
    stopped = await h.ctrl.abort_update_weights(window.snapshot)
    events, deleted = len(h.events), list(h.platform.deleted)
    assert await h.ctrl.abort_update_weights(window.snapshot) == stopped == ["demo-cell-0", "demo-cell-1"]
    assert (len(h.events), h.platform.deleted) == (events, deleted)
    with pytest.raises(SnapshotMismatch):  # an end never repeats an abort
        await h.ctrl.end_update_weights(window.snapshot, "4")
    assert h.ctrl.fleet.weight_version == "3"


async def test_version_defaults_to_the_next_integer() -> None:
    h = harness(1)
    await serve(h, "4")
    window = await h.ctrl.start_update_weights("t")
    await h.ctrl.end_update_weights(window.snapshot)
    assert h.ctrl.fleet.weight_version == "5"


async def test_cell_recreated_during_the_window_is_excluded_at_end() -> None:
    h = harness(2)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    # Another controller instance (or a person) replaced cell 1 meanwhile: generation 1 on the platform.
    await h.platform.delete_cell("demo-cell-1")
    await h.platform.create_cell(CellRequest(name="demo-cell-1", index=1, generation=1))
    await settle(h.ctrl)
    assert (h.cell(1).generation, h.cell(1).state) == (1, S.PendingWeights)
    served = await h.ctrl.end_update_weights(window.snapshot, "1")
    assert served == ["demo-cell-0"]
    assert h.states() == [S.Serving, S.PendingWeights]
    assert h.cell(1).weight_version is None
    second = await h.ctrl.start_update_weights("t")
    assert second.snapshot == {"demo-cell-0": 0, "demo-cell-1": 1}


async def test_reconcile_defers_replacement_while_the_lock_is_held() -> None:
    h = harness(2)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    h.platform.fail_pod("demo-cell-1")
    await h.ctrl.reconcile()
    assert h.cell(1).state == S.Unhealthy
    await h.clock.advance(60)  # the backoff (5 s) is long past
    await settle(h.ctrl)
    assert h.platform.deleted == [] and len(h.platform.created) == 2
    await h.ctrl.end_update_weights(window.snapshot, "1")
    assert h.states() == [S.Serving, S.Unhealthy]
    await h.ctrl.reconcile()  # deferred, not lost
    assert h.platform.deleted == ["demo-cell-1"]
    assert [(r.name, r.generation) for r in h.platform.created[2:]] == [("demo-cell-1", 1)]
    await bring_up(h)
    assert h.states() == [S.Serving, S.PendingWeights]
    assert h.cell(1).restarts == 1


async def test_abort_stops_unchanged_participants_without_charging_the_budget() -> None:
    h = harness(2)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    stopped = await h.ctrl.abort_update_weights(window.snapshot)
    assert stopped == ["demo-cell-0", "demo-cell-1"]
    assert sorted(h.platform.deleted) == ["demo-cell-0", "demo-cell-1"]
    assert h.ctrl.lock.current is None and h.ctrl.health.active
    assert [(c.generation, c.state, c.restarts) for c in map(h.cell, (0, 1))] == [(1, S.Pending, 0)] * 2
    assert Reason.WindowAborted in h.reasons()
    await bring_up(h)
    assert [(r.name, r.generation) for r in h.platform.created[2:]] == [("demo-cell-0", 1), ("demo-cell-1", 1)]
    assert h.states() == [S.PendingWeights, S.PendingWeights]


async def test_an_engine_that_died_inside_a_window_is_charged_when_the_window_is_aborted() -> None:
    """An engine killed inside a window fails the trainer's update, which aborts. The abort must
    not recreate the dead cell uncharged like the others: an engine that crashed in every window
    would never reach its restart budget. Proof of death: nothing listens on its port (cell 0)
    or its pod failed (cell 2); cell 1, alive, is stopped uncharged as before."""
    h = harness(3)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    h.engine(0).healthy = False  # connection refused
    h.platform.fail_pod("demo-cell-2")
    stopped = await h.ctrl.abort_update_weights(window.snapshot)
    assert stopped == ["demo-cell-0", "demo-cell-1", "demo-cell-2"]
    assert h.ctrl.lock.current is None
    assert (h.cell(1).generation, h.cell(1).state, h.cell(1).restarts) == (1, S.Pending, 0)
    assert [h.cell(i).state for i in (0, 2)] == [S.Unhealthy, S.Unhealthy]
    assert "unreachable" in h.cell(0).message and "pod failed" in h.cell(2).message
    await h.clock.advance(5)  # the restart backoff
    await bring_up(h)
    assert [(h.cell(i).generation, h.cell(i).restarts) for i in (0, 2)] == [(1, 1), (1, 1)]
    replaced = [e.cell for e in h.events if e.reason == Reason.CellReplaced]
    assert sorted(replaced) == ["demo-cell-0", "demo-cell-2"]


async def test_a_hung_engine_at_abort_is_not_proof_of_death_and_the_abort_is_bounded() -> None:
    h = harness(1)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    h.engine(0).hang = True
    aborting = asyncio.ensure_future(h.ctrl.abort_update_weights(window.snapshot))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not aborting.done()
    await h.clock.advance(5)  # ABORT_EVIDENCE_SECONDS
    assert await asyncio.wait_for(aborting, 5) == ["demo-cell-0"]
    assert (h.cell(0).generation, h.cell(0).state, h.cell(0).restarts) == (1, S.Pending, 0)


async def test_abort_releases_the_lock_even_if_stopping_fails() -> None:
    h = harness(2)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    h.platform.fail_delete = True
    stopped = await h.ctrl.abort_update_weights(window.snapshot)
    assert stopped == ["demo-cell-0", "demo-cell-1"]
    assert h.ctrl.lock.current is None
    assert any("stopping failed" in e.message for e in h.events if e.reason == Reason.WindowAborted)
    h.platform.fail_delete = False
    await h.ctrl.reconcile()  # the stale generation-0 pods are deleted, generation 1 created
    assert sorted(h.platform.deleted) == ["demo-cell-0", "demo-cell-1"]
    assert {h.platform.generation_of(f"demo-cell-{i}") for i in (0, 1)} == {1}


async def test_expired_lock_is_released_aborted_and_reported() -> None:
    h = harness(1)
    await bring_up(h)
    await h.ctrl.start_update_weights("slow-trainer")
    await h.clock.advance(599)
    await h.ctrl.reconcile()
    assert h.ctrl.lock.current is not None
    await h.clock.advance(1)
    await h.ctrl.reconcile()
    assert h.ctrl.lock.current is None
    expired = [e for e in h.events if e.reason == Reason.LockExpired]
    assert expired and expired[0].warning and "slow-trainer" in expired[0].message
    assert h.cell(0).generation == 1  # its participant may hold half-written weights: stopped
    assert [e.outcome for e in h.events if e.outcome] == ["expired"]  # one closing event, not LockExpired too


async def test_expired_lock_lets_the_next_window_open() -> None:
    h = harness(1)
    await bring_up(h)
    await h.ctrl.start_update_weights("gone")
    await h.clock.advance(600)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("next")
    assert window.lock.holder == "next" and window.snapshot == {"demo-cell-0": 1}


async def test_weight_check_mismatch_names_tensors_and_fails_the_window(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path, JOB)
    h = harness(3, check_weights=True, audit=audit)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    assert h.ctrl.status_patch()["lock"]["weightsChecksums"]["demo-cell-0"] == {"w": "init"}
    for i in range(3):
        h.engine(i).checksums = {"w": "v1", "bias": "b1"}
    h.engine(2).checksums = {"w": "v1", "bias": "CORRUPT"}
    with pytest.raises(WeightCheckMismatch) as err:
        await h.ctrl.end_update_weights(window.snapshot, "1")
    assert err.value.mismatched == {"demo-cell-2": ["bias"]}
    assert h.ctrl.lock.current is None
    assert Reason.WeightCheckFailed in h.reasons()
    assert [e.outcome for e in h.events if e.outcome] == ["check_failed"]  # one closing event, not WeightCheckFailed too
    checks = [r for r in read_audit_log(audit.path) if r.type == "weight_check"]
    assert checks and checks[0].fields["ok"] is False and checks[0].fields["mismatched"] == {"demo-cell-2": ["bias"]}


async def test_weight_check_passes_when_participants_agree() -> None:
    h = harness(2, check_weights=True)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    for i in range(2):
        h.engine(i).checksums = {"w": "v1"}
    assert await h.ctrl.end_update_weights(window.snapshot, "1", expected_checksums={"w": "v1"}) == [
        "demo-cell-0", "demo-cell-1"]


# -- health and healing ------------------------------------------------------------------------


async def test_failing_probes_make_a_serving_cell_unhealthy_and_leave_serving() -> None:
    h = harness(1)
    await serve(h)
    h.engine(0).healthy = False
    await h.clock.advance(10)
    await h.ctrl.probe_health()
    assert h.cell(0).state == S.Serving and h.cell(0).consecutive_failures == 1
    await h.clock.advance(10)
    await h.ctrl.probe_health()
    assert h.cell(0).state == S.Unhealthy
    assert h.platform.serving["demo-cell-0"] is False
    assert h.ctrl.serving_endpoints() == []
    assert Reason.CellUnhealthy in h.reasons()


async def test_hanging_engine_fails_probes_within_the_timeout() -> None:
    h = harness(1)
    await serve(h)
    h.engine(0).hang = True
    for _ in range(2):
        await h.clock.advance(10)
        await with_clock(h.clock, h.ctrl.probe_health())
    assert h.cell(0).state == S.Unhealthy
    assert "timed out after 5 s" in h.cell(0).message


async def test_a_hung_engine_holds_up_neither_the_pass_nor_the_other_cells_probes() -> None:
    """A pass waits for its probes only briefly. It used to wait for the slowest one, so a hung
    engine held every pass (and the replacement of any other cell) for timeoutSeconds."""
    h = harness(2)
    await serve(h)
    h.engine(0).hang = True
    h.engine(1).healthy = False
    await h.clock.advance(10)
    started = h.clock.now()
    await with_clock(h.clock, h.ctrl.run_pass(), step=0.1)
    assert h.clock.now() - started < h.ctrl.spec.health_check.timeout_seconds
    assert (h.cell(0).consecutive_failures, h.cell(1).consecutive_failures) == (0, 1)  # cell 0's probe still out
    probes = h.engine(0).health_started
    await h.ctrl.run_pass()  # no second probe of a cell whose probe is out
    assert h.engine(0).health_started == probes
    await h.clock.advance(h.ctrl.spec.health_check.timeout_seconds)
    assert h.cell(0).consecutive_failures == 1  # the late answer applied itself, without a pass


async def test_a_failing_cell_is_probed_again_when_due_without_waiting_for_a_pass() -> None:
    """Failures are counted to the threshold on the cell's own schedule: passes are slow when the
    API server is, and the threshold used to be reached only as fast as passes came."""
    h = harness(1)
    await serve(h)
    h.engine(0).healthy = False
    await h.clock.advance(10)
    await h.ctrl.probe_health()
    assert h.cell(0).consecutive_failures == 1
    await h.clock.advance(10)  # no pass, no probe_health call
    assert h.cell(0).state == S.Unhealthy


async def test_dead_pod_or_container_restart_marks_the_cell_unhealthy() -> None:
    h = harness(2)
    await serve(h)
    h.platform.restart_pod("demo-cell-0")
    h.platform.fail_pod("demo-cell-1")
    await h.ctrl.reconcile()
    assert h.states() == [S.Unhealthy, S.Unhealthy]
    assert "restarts 1" in h.cell(0).message and "Failed" in h.cell(1).message


async def test_startup_deadline_exceeded() -> None:
    h = harness(1, startup_deadline=100)
    await h.ctrl.reconcile()
    await h.ctrl.reconcile()
    h.engines(FakePlatform.endpoint_of("demo-cell-0", 0)).healthy = False
    await settle(h.ctrl)
    assert h.cell(0).state == S.Starting
    await h.clock.advance(100)
    await h.ctrl.reconcile()
    assert h.cell(0).state == S.Unhealthy
    assert Reason.StartupDeadlineExceeded in h.reasons()


def place(platform: FakePlatform, cell: str, *nodes: str | None) -> None:
    """The scheduler's verdict on each pod of the cell: a node, or None (still unschedulable)."""
    c = platform.cells[cell]
    c.pods = [dataclasses.replace(p, node=n) for p, n in zip(c.pods, nodes, strict=True)]


async def test_a_partly_scheduled_cell_is_deleted_after_the_scheduling_deadline_and_retried() -> None:
    h = harness(1, gpus_per_engine=16, gpus_per_node=8, platform=FakePlatform(start_running=False, pods_per_cell=2),
                scheduling_deadline=60)
    await h.ctrl.reconcile()
    place(h.platform, "demo-cell-0", "gpu-0", None)  # one pod holds 8 GPUs, the other never fits
    await h.clock.advance(59)
    await h.ctrl.reconcile()
    assert h.cell(0).state == S.Pending and h.platform.deleted == []
    await h.clock.advance(1)
    await h.ctrl.reconcile()
    assert h.cell(0).state == S.Unhealthy and "only 1/2 pods scheduled within 60 s" in h.cell(0).message
    assert Reason.SchedulingDeadlineExceeded in h.reasons()
    await h.ctrl.reconcile()
    assert h.platform.deleted == ["demo-cell-0"]  # its GPUs are free while it waits for the backoff
    await h.clock.advance(5)
    await h.ctrl.reconcile()
    assert h.platform.generation_of("demo-cell-0") == 1 and h.cell(0).restarts == 1


async def test_a_cell_with_no_pod_scheduled_holds_nothing_and_keeps_waiting() -> None:
    h = harness(1, gpus_per_engine=16, gpus_per_node=8, platform=FakePlatform(start_running=False, pods_per_cell=2),
                scheduling_deadline=60)
    await h.ctrl.reconcile()
    await h.clock.advance(120)
    await h.ctrl.reconcile()
    assert h.cell(0).state == S.Pending and h.platform.deleted == []
    assert h.ctrl._next_wakeup() > 0  # past the deadline, a waiting cell does not spin the loop


async def test_restart_budget_backoff_then_failed_with_no_more_creates() -> None:
    h = harness(1, max_restarts=2)
    await bring_up(h)
    delays = []
    for generation in range(2):
        h.platform.fail_pod("demo-cell-0")
        await h.ctrl.reconcile()
        failed_at = h.clock.now()
        while h.platform.generation_of("demo-cell-0") == generation or "demo-cell-0" not in h.platform.cells:
            await h.clock.advance(1)
            await h.ctrl.reconcile()
        delays.append(h.clock.now() - failed_at)
        await bring_up(h)
        assert h.cell(0).state == S.PendingWeights
    assert delays == [5, 10]
    h.platform.fail_pod("demo-cell-0")
    await h.ctrl.reconcile()
    await h.ctrl.reconcile()
    assert h.cell(0).state == S.Failed
    budget = [e for e in h.events if e.reason == Reason.RestartBudgetExhausted]
    assert budget and budget[0].warning
    creates = len(h.platform.created)
    for _ in range(20):
        await h.clock.advance(300)
        await settle(h.ctrl, passes=1)
    assert len(h.platform.created) == creates
    assert h.ctrl.status_patch()["restartsTotal"] == 2


async def test_raised_budget_revives_a_failed_cell() -> None:
    h = harness(1, max_restarts=0)
    await bring_up(h)
    h.platform.fail_pod("demo-cell-0")
    await settle(h.ctrl)
    assert h.cell(0).state == S.Failed
    h.ctrl.update_spec(spec(1, max_restarts=1))
    await bring_up(h)
    assert (h.cell(0).state, h.cell(0).generation) == (S.PendingWeights, 1)


async def test_scale_down_deletes_surplus_cells_but_not_during_a_window() -> None:
    h = harness(3)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    h.ctrl.update_spec(spec(2))
    await h.ctrl.reconcile()
    assert h.platform.deleted == []
    await h.ctrl.end_update_weights(window.snapshot, "1")
    await h.ctrl.reconcile()
    assert h.platform.deleted == ["demo-cell-2"] and sorted(h.ctrl.fleet.cells) == ["demo-cell-0", "demo-cell-1"]
    assert h.ctrl.status_patch()["ready"] == "2/2"


# -- offload / onload / rollout ----------------------------------------------------------------


async def test_offload_flushes_then_releases_and_onload_restores_the_state() -> None:
    h = harness(2)
    await serve(h)
    change = await h.ctrl.offload([MemoryTag.weights, MemoryTag.kv_cache])
    assert change.cells == {"demo-cell-0": ["weights", "kv_cache"], "demo-cell-1": ["weights", "kv_cache"]}
    assert h.engine(0).calls[-2:] == ["flush_cache", "release_memory"]
    assert h.engine(0).released == {MemoryTag.weights, MemoryTag.kv_cache}
    assert h.states() == [S.Offloaded, S.Offloaded]
    assert not any(h.platform.serving.values())
    assert h.ctrl.status_patch()["engines"][0]["memory"] == ["weights", "kv_cache"]
    # monitoring is paused: a due probe is not sent
    await h.clock.advance(60)
    probes = h.engine(0).health_started
    await h.ctrl.probe_health()
    assert h.engine(0).health_started == probes
    await h.ctrl.onload([MemoryTag.weights])
    assert h.states() == [S.Serving, S.Serving]
    assert h.cell(0).memory == (MemoryTag.kv_cache,)
    assert not any(h.platform.serving.values())  # no KV cache yet: not in the serving set
    await h.ctrl.onload()
    assert h.cell(0).memory == () and all(h.platform.serving.values())
    assert h.engine(0).released == set()
    assert h.ctrl.health.active
    assert Reason.Offloaded in h.reasons() and Reason.Onloaded in h.reasons()


async def test_an_offload_and_an_onload_are_one_event_each_naming_their_cells(tmp_path: Path) -> None:
    """An Event per cell moved made one offload/onload of 16 cells 34 Event writes, half the
    API writes of the pair (issue 13); each cell's move stays in the audit log."""
    audit = AuditLog(tmp_path, JOB)
    h = harness(4, audit=audit)
    await serve(h)
    h.events.clear()
    await h.ctrl.offload(["weights"])
    await h.ctrl.onload(["weights"])
    assert h.states() == [S.Serving] * 4
    assert h.reasons() == [Reason.Offloaded, Reason.Onloaded]
    assert all(f"{JOB}-cell-{i}" in e.message for e in h.events for i in range(4))
    moves = [(r.cell, r.fields["to"]) for r in read_audit_log(audit.path) if r.type == "cell_transition"][-8:]
    assert sorted(moves) == sorted((f"{JOB}-cell-{i}", to) for i in range(4) for to in ("Offloaded", "Serving"))


async def test_offload_of_kv_cache_only_keeps_the_state() -> None:
    h = harness(1)
    await bring_up(h)
    await h.ctrl.offload(["kv_cache", "cuda_graph"])
    assert h.states() == [S.PendingWeights]
    assert h.cell(0).memory == (MemoryTag.kv_cache, MemoryTag.cuda_graph)
    await h.ctrl.onload(["kv_cache", "cuda_graph"])
    assert h.states() == [S.PendingWeights] and h.cell(0).memory == ()


async def test_colocated_step_order_updates_offloaded_cells() -> None:
    """miles' order: offload all, train, onload weights, update window, onload kv."""
    h = harness(2)
    await serve(h, "1")
    await h.ctrl.offload(["weights", "kv_cache", "cuda_graph"])
    await h.ctrl.onload(["weights"])
    window = await h.ctrl.start_update_weights("t")
    assert sorted(window.snapshot) == ["demo-cell-0", "demo-cell-1"]
    await h.ctrl.end_update_weights(window.snapshot, "2")
    await h.ctrl.onload(["kv_cache", "cuda_graph"])
    await h.ctrl.prepare_rollout(2)
    assert h.states() == [S.Serving, S.Serving] and all(h.platform.serving.values())
    assert h.ctrl.status_patch()["rolloutId"] == 2 and h.ctrl.fleet.weight_version == "2"


async def test_flush_is_retried_a_bounded_number_of_times() -> None:
    h = harness(2)
    await bring_up(h)
    h.engine(0).flush_failures = 3
    h.ctrl.memory.flush_retries = 5
    change = await with_clock(h.clock, h.ctrl.offload(["kv_cache"]))
    assert change.failed == {} and h.engine(0).calls.count("flush_cache") == 4
    h.engine(1).flush_failures = 100
    change = await with_clock(h.clock, h.ctrl.offload(["weights"]))
    assert list(change.failed) == ["demo-cell-1"] and h.engine(1).calls.count("flush_cache") == 1 + 5
    assert h.cell(1).state == S.PendingWeights and h.cell(1).memory == (MemoryTag.kv_cache,)
    assert h.cell(0).state == S.Offloaded


async def test_prepare_rollout_resumes_monitoring_and_records_the_rollout() -> None:
    h = harness(1)
    await serve(h)
    await h.ctrl.offload(["kv_cache"])
    assert not h.ctrl.health.active
    await h.ctrl.prepare_rollout(12)
    assert h.ctrl.health.active and h.ctrl.rollout_id == 12
    assert Reason.RolloutPrepared in h.reasons()


# -- restore, run loop, audit ------------------------------------------------------------------


async def test_restore_from_status_keeps_cells_budget_window_and_version() -> None:
    h = harness(3)
    await serve(h, "3")
    h.platform.fail_pod("demo-cell-2")
    await h.ctrl.reconcile()
    await h.clock.advance(5)
    await bring_up(h)  # cell 2 recreated: generation 1, one restart charged
    window = await h.ctrl.start_update_weights("trainer")
    status = RLJobStatus.model_validate(h.ctrl.status_patch())
    creates = len(h.platform.created)

    h2 = h.new_controller(restore=status)
    assert {n: (c.generation, c.state, c.restarts, c.weight_version) for n, c in h2.fleet.cells.items()} == {
        n: (c.generation, c.state, c.restarts, c.weight_version) for n, c in h.ctrl.fleet.cells.items()}
    assert h2.fleet.weight_version == "3"
    assert h2.lock.current is not None and h2.lock.current.snapshot == window.snapshot
    assert h2.lock.current.expires == h.ctrl.lock.current.expires
    assert not h2.health.active  # the open window pauses monitoring
    await settle(h2)
    assert len(h.platform.created) == creates  # nothing doubled
    served = await h2.end_update_weights(window.snapshot, "4")
    assert served == ["demo-cell-0", "demo-cell-1", "demo-cell-2"]
    assert h2.status_patch()["restartsTotal"] == 1


async def test_restored_lock_still_expires() -> None:
    h = harness(1)
    await bring_up(h)
    await h.ctrl.start_update_weights("t")
    status = RLJobStatus.model_validate(h.ctrl.status_patch())
    await h.clock.advance(700)
    h2 = h.new_controller(restore=status)
    await h2.reconcile()
    assert h2.lock.current is None and Reason.LockExpired in h.reasons()


async def test_restored_offloaded_cell_returns_to_its_state() -> None:
    h = harness(1)
    await serve(h)
    await h.ctrl.offload(["weights"])
    h2 = h.new_controller(restore=RLJobStatus.model_validate(h.ctrl.status_patch()))
    assert not h2.health.active
    await h2.onload(["weights"])
    assert h2.fleet.cells["demo-cell-0"].state == S.Serving


async def test_run_loop_brings_cells_up_and_stops() -> None:
    h = harness(2)
    h.ctrl.poll_seconds = 2
    stop = asyncio.Event()
    task = asyncio.create_task(h.ctrl.run(stop))
    for _ in range(100):
        if h.states() == [S.PendingWeights, S.PendingWeights]:
            break
        await h.clock.advance(1)
    assert h.states() == [S.PendingWeights, S.PendingWeights]
    stop.set()
    await asyncio.wait_for(task, 5)  # real-time guard only: stop must end the loop promptly


async def test_run_loop_survives_platform_errors() -> None:
    h = harness(1)
    h.platform.fail_create = True
    stop = asyncio.Event()
    task = asyncio.create_task(h.ctrl.run(stop))
    for _ in range(30):
        await h.clock.advance(1)
    assert not task.done()
    h.platform.fail_create = False
    for _ in range(30):
        if h.states() == [S.PendingWeights]:
            break
        await h.clock.advance(1)
    assert h.states() == [S.PendingWeights]
    stop.set()
    await asyncio.wait_for(task, 5)


class GatedPlatform(FakePlatform):
    """create_cell waits at `gate`; `most` is how many creations were in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = self.most = 0

    async def create_cell(self, request: CellRequest) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        await super().create_cell(request)


async def test_dead_cells_are_replaced_together_not_one_after_another() -> None:
    """A pass replaces its dead cells at once: each replacement is platform round trips (several
    API calls on Kubernetes), and made one after another they added up to seconds under load."""
    platform = GatedPlatform()
    h = harness(3, platform=platform)
    await serve(h)
    for i in range(3):
        h.platform.fail_pod(f"demo-cell-{i}")
    await h.ctrl.reconcile()
    assert h.states() == [S.Unhealthy] * 3 and sorted(h.platform.deleted) == [f"demo-cell-{i}" for i in range(3)]
    await h.clock.advance(5)  # the backoff
    await all_in_flight_at_once(platform, h.ctrl.reconcile(), 3)
    assert [h.platform.generation_of(f"demo-cell-{i}") for i in range(3)] == [1, 1, 1]


async def all_in_flight_at_once(platform: Any, call: Awaitable[Any], n: int) -> None:
    """Run `call` with the platform's `gate` shut: its `n` platform calls must be in flight
    together (`most`), not one after another; then open the gate and let it finish."""
    platform.gate.clear()
    task = asyncio.ensure_future(call)
    try:
        for _ in range(100):
            if platform.in_flight == n:
                break
            await asyncio.sleep(0)
        assert platform.most == n
    finally:
        platform.gate.set()
        await task


class GatedLabelPlatform(FakePlatform):
    """set_serving waits at `gate`; `most` is how many label changes were in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = self.most = 0

    async def set_serving(self, name: str, serving: bool) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        await super().set_serving(name, serving)


async def test_offload_relabels_every_cell_at_once() -> None:
    """An offload takes every cell out of serving: a label patch (or two API calls) per cell, all at
    once; one after another they made the offload of 16 engines half a second slower than the engines."""
    platform = GatedLabelPlatform()
    h = harness(3, platform=platform)
    await serve(h)
    await all_in_flight_at_once(platform, h.ctrl.offload([MemoryTag.weights]), 3)
    assert [h.platform.serving[f"demo-cell-{i}"] for i in range(3)] == [False] * 3


async def test_probes_label_a_jobs_cells_serving_at_once_not_under_the_mutex_in_turn() -> None:
    """Cells answering their probes together are labelled serving together: each label PATCH was
    awaited under the fleet's mutex, so a job's cells became Serving one API call after another
    (issue 13: at 100 jobs, ~20 s apart)."""
    platform = GatedLabelPlatform()
    h = harness(3, platform=platform, serve_initial_weights=True)
    for _ in range(2):
        await h.ctrl.reconcile()
    assert h.states() == [S.Starting] * 3
    await all_in_flight_at_once(platform, h.ctrl.probe_health(), 3)
    assert h.states() == [S.Serving] * 3
    assert h.platform.serving == {f"demo-cell-{i}": True for i in range(3)}


async def test_a_label_that_changed_while_its_write_was_out_is_written_next() -> None:
    """A cell's label write is made outside the mutex; a change of the cell meanwhile (here: it
    stops serving) is written after it, never in a second PATCH racing the first."""
    platform = GatedLabelPlatform()
    h = harness(1, platform=platform, serve_initial_weights=True)
    for _ in range(2):
        await h.ctrl.reconcile()
    platform.gate.clear()
    probing = asyncio.ensure_future(h.ctrl.probe_health())
    for _ in range(100):
        if platform.in_flight:
            break
        await asyncio.sleep(0)
    assert platform.in_flight == 1 and h.states() == [S.Serving]
    offload = asyncio.ensure_future(h.ctrl.offload([MemoryTag.weights]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert platform.most == 1  # the offload's label change waits for the write that is out
    platform.gate.set()
    await asyncio.gather(probing, offload)
    assert platform.most == 1 and h.platform.serving == {"demo-cell-0": False}


class HangingPlatform(FakePlatform):
    """A platform whose observe_cells never answers while `hang` is set."""

    hang = False

    async def observe_cells(self) -> Sequence[CellObservation]:
        if self.hang:
            await asyncio.Event().wait()
        return await super().observe_cells()


async def test_run_pass_logs_errors_instead_of_raising(caplog: pytest.LogCaptureFixture) -> None:
    h = harness(1)
    h.platform.fail_create = True
    with caplog.at_level(logging.ERROR, logger="controller_runtime.controller"):
        report = await h.ctrl.run_pass()
    assert 0 <= report.delay <= h.ctrl.poll_seconds
    assert "reconcile of demo failed" in caplog.text and h.states() == [S.Pending]
    assert len(report.failures) == 1 and report.failures[0].startswith("reconcile: "), report.failures
    h.platform.fail_create = False
    for _ in range(3):
        await h.ctrl.run_pass()
    assert h.states() == [S.PendingWeights]


async def test_run_pass_is_bounded_by_the_pass_timeout() -> None:
    platform = HangingPlatform()
    h = harness(1, platform=platform)
    await bring_up(h)
    platform.hang = True
    started = h.clock.now()
    report = await with_clock(h.clock, h.ctrl.run_pass())
    assert h.clock.now() - started >= h.ctrl.pass_timeout and 0 <= report.delay <= h.ctrl.poll_seconds
    assert [f.split(":")[0] for f in report.failures] == ["reconcile"], report.failures
    platform.hang = False
    h.platform.fail_pod("demo-cell-0")
    await h.ctrl.run_pass()  # the timed-out pass let go of the mutex
    assert h.states() == [S.Unhealthy]


async def test_audit_log_records_transitions_and_updates(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path, JOB)
    h = harness(1, audit=audit)
    await serve(h, "1")
    records = read_audit_log(audit.path)
    transitions = [(r.cell, r.fields["from"], r.fields["to"]) for r in records if r.type == "cell_transition"]
    assert transitions == [("demo-cell-0", "Pending", "Starting"), ("demo-cell-0", "Starting", "PendingWeights"),
                           ("demo-cell-0", "PendingWeights", "Serving")]
    assert [r.fields["version"] for r in records if r.type == "weights_updated"] == ["1"]
    assert any(r.type == "window_opened" for r in records)
    assert all(r.job == JOB and r.component == "inference_controller" for r in records)


# -- the eval fleet ----------------------------------------------------------------------------

EVAL = EvalFleetSpec(replicas=2, checkpoint="/ckpt/base", weight_version="base")


async def test_eval_cells_are_pinned_and_kept_out_of_windows_and_serving() -> None:
    h = harness(1, eval=EVAL)
    await bring_up(h)
    roles = {r.name: r.role for r in h.platform.created}
    assert roles == {"demo-cell-0": "policy", "demo-eval-0": "eval", "demo-eval-1": "eval"}
    assert [c.state for c in h.ctrl.fleet.evals()] == [S.PendingWeights] * 2
    window = await h.ctrl.start_update_weights("t")
    assert list(window.snapshot) == ["demo-cell-0"]
    await h.ctrl.end_update_weights(window.snapshot, "1")

    fleet = await h.ctrl.eval_fleet()
    assert fleet.ok and fleet.pinned_version == "base" and len(fleet.endpoints) == 2
    evals = h.ctrl.fleet.evals()
    assert [(c.state, c.weight_version) for c in evals] == [(S.Serving, "base")] * 2
    assert h.ctrl.serving_endpoints() == [h.cell(0).endpoint]
    assert h.platform.serving["demo-eval-0"] is False
    assert h.ctrl.status_patch()["ready"] == "1/1"
    assert [s.name for s in h.ctrl.engine_statuses()] == ["demo-cell-0", "demo-eval-0", "demo-eval-1"]
    again = await h.ctrl.eval_fleet()
    assert again.ok
    assert h.engines(evals[0].endpoint).calls.count("update_weights_from_disk") == 1  # pinned once


async def test_eval_fleet_skips_when_not_configured_or_not_ready() -> None:
    h = harness(1)
    assert (await h.ctrl.eval_fleet()).skip_reason == "not_configured"
    h = harness(1, eval=EVAL, platform=FakePlatform(start_running=False))
    await settle(h.ctrl)
    fleet = await h.ctrl.eval_fleet()
    assert (fleet.ok, fleet.skip_reason) == (False, "unhealthy") and "0/2 eval cells ready" in fleet.message


async def test_eval_pin_violation_is_reported_and_cells_stay_unpinned() -> None:
    h = harness(1, eval=EVAL)
    await bring_up(h)
    stale = h.engines(h.ctrl.fleet.eval_cells["demo-eval-1"].endpoint or "")

    async def load_without_version(path: str, version: str | None = None) -> None:
        stale.weight_version = "older"

    stale.update_weights_from_disk = load_without_version  # type: ignore[method-assign]
    fleet = await h.ctrl.eval_fleet()
    assert (fleet.ok, fleet.skip_reason) == (False, "pin_violation") and "'older'" in fleet.message
    assert [c.state for c in h.ctrl.fleet.evals()] == [S.PendingWeights] * 2
    assert Reason.EvalSkipped in h.reasons()


async def test_eval_cells_survive_restore_in_their_own_group() -> None:
    h = harness(1, eval=EVAL)
    await bring_up(h)
    await h.ctrl.eval_fleet()
    h2 = h.new_controller(restore=RLJobStatus.model_validate(h.ctrl.status_patch()))
    assert sorted(h2.fleet.eval_cells) == ["demo-eval-0", "demo-eval-1"] and sorted(h2.fleet.cells) == ["demo-cell-0"]
    creates = len(h.platform.created)
    await settle(h2)
    assert len(h.platform.created) == creates and h.platform.deleted == []


async def test_onloaded_cell_that_slept_through_an_update_waits_for_weights() -> None:
    h = harness(2)
    await serve(h, "1")
    h.ctrl.memory.flush_retries = 1
    h.engine(1).flush_failures = 1  # cell 1 refuses to offload and stays Serving
    change = await h.ctrl.offload(["weights"])
    assert list(change.failed) == ["demo-cell-1"] and h.states() == [S.Offloaded, S.Serving]
    await h.ctrl.prepare_rollout(1)
    window = await h.ctrl.start_update_weights("t")
    assert window.snapshot == {"demo-cell-1": 0}  # the offloaded cell cannot take weights
    await h.ctrl.end_update_weights(window.snapshot, "2")
    await h.ctrl.onload(["weights"])
    assert h.states() == [S.PendingWeights, S.Serving]
    assert "fleet is at 2" in h.cell(0).message
    assert h.ctrl.serving_endpoints() == [h.cell(1).endpoint]


async def test_end_after_expiry_is_refused_and_abort_after_expiry_answers_the_same() -> None:
    h = harness(1)
    await bring_up(h)
    window = await h.ctrl.start_update_weights("t")
    await h.clock.advance(600)
    assert await h.ctrl.abort_update_weights(window.snapshot) == ["demo-cell-0"]
    h2 = harness(1)
    await bring_up(h2)
    window2 = await h2.ctrl.start_update_weights("t")
    await h2.clock.advance(601)
    with pytest.raises(SnapshotMismatch):
        await h2.ctrl.end_update_weights(window2.snapshot, "1")
    assert h2.ctrl.fleet.weight_version is None and h2.states() == [S.Pending]
    assert Reason.LockExpired in h2.reasons()


async def test_probe_in_flight_across_offload_and_resume_is_discarded() -> None:
    h = harness(1)
    await serve(h)
    engine = h.engine(0)
    engine.healthy = False
    await h.clock.advance(10)
    await h.ctrl.probe_health()
    assert h.cell(0).consecutive_failures == 1  # one more failure would make it Unhealthy
    engine.health_gate = asyncio.Event()
    started = engine.health_started
    await h.clock.advance(10)  # the failing cell's next probe is due (it starts on its own, or here:)
    probing = asyncio.create_task(h.ctrl.probe_health())
    for _ in range(1000):
        if engine.health_started > started:
            break
        await asyncio.sleep(0)
    assert engine.health_started > started
    await h.ctrl.offload(["kv_cache"])  # pause: epoch moves on
    await h.ctrl.onload(["kv_cache"])  # resume: epoch moves on again
    engine.health_gate.set()
    await asyncio.wait_for(probing, 5)
    for _ in range(100):  # the in-flight probe answers and is applied (or discarded)
        await asyncio.sleep(0)
    assert h.cell(0).state == S.Serving and h.cell(0).consecutive_failures == 1


async def test_a_recreated_cell_is_probed_at_its_new_endpoint_not_by_the_old_generations_probe_loop() -> None:
    """A failing cell's probe loop outlived its generation: it probed the old engine's address
    for the recreated cell, which stayed Starting with no probe of its own (heal_bench saw
    replacements Starting for 140 s while their engines served)."""
    h = harness(2)
    await bring_up(h)
    old = h.engine(1)
    old.healthy = False  # gen 0 fails one probe (threshold 2): its probe loop goes on, on its own
    await h.clock.advance(10)
    await h.ctrl.probe_health()
    assert h.cell(1).consecutive_failures == 1 and "demo-cell-1" in h.ctrl._probing
    h.platform.fail_pod("demo-cell-1")  # meanwhile its pod fails: Unhealthy, recreated
    await h.ctrl.reconcile()
    await h.clock.advance(6)  # the restart backoff (5 s)
    for _ in range(6):
        await h.ctrl.reconcile()
        await asyncio.sleep(0)
    assert h.cell(1).generation == 1 and h.cell(1).state is S.Starting, h.cell(1)
    assert h.engine(1) is not old and h.engine(1).healthy
    for _ in range(20):  # the new engine answers: the cell must leave Starting
        await h.clock.advance(1)
        await settle(h.ctrl, passes=1)
    assert h.cell(1).state is S.PendingWeights, (h.cell(1), old.health_started, h.engine(1).health_started)
