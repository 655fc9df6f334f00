"""The Kubernetes call pool's order: a started pass's calls ahead of later passes', calls made
outside passes (the Lease, access reviews) ahead of all passes (issue 13: as one FIFO of 8 threads
it livelocked at 1,000 RLJobs). The first two tests drive the real `KubeApi` on a fake REST client
with one thread held busy while a backlog queues; they fail on the FIFO pool."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from typing import Any

import pytest
from rljob_operator.kube.api_pool import (
    OUTSIDE_PASSES,
    PASS_RANK,
    RESYNC,
    WORK,
    CallQueue,
    PriorityPool,
    Rank,
    in_pass,
    rank,
)
from rljob_operator.kube.connection import Response
from rljob_operator.kube.kubeapi import KubeApi, NotFound
from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.job_runtime import JobRuntime
from rljob_operator.registry import JobRegistry

from controller_runtime.clock import FakeClock
from controller_runtime.fakes import FakeEngines, FakePlatform
from tests.unit.test_job_runtime import FakeKube, rljob, runtime, settle


class GatedClient:
    """Stands in for `kube.connection.ApiConnection`. Records the order in which
    requests reach the server; the request for `hold` blocks its thread until `release`."""

    def __init__(self, hold: str) -> None:
        self.hold = hold
        self.served: list[str] = []
        self.holding = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def request(self, method: str, path: str, *_: Any, **__: Any) -> Response:
        with self._lock:
            self.served.append(path)
        if path == self.hold:
            self.holding.set()
            assert self.release.wait(10), "the test never released the held request"
        if path.endswith("/missing"):
            return Response(404, "Not Found", b'{"message": "not found"}')
        return Response(200, "OK", b"{}")

    def close(self) -> None:
        pass


async def hold_the_only_thread(kube: KubeApi, client: GatedClient) -> asyncio.Task[Any]:
    """Start the held request (as pass 1.0) and wait until the pool's one thread is inside it."""
    with in_pass(1.0):
        held = asyncio.create_task(kube.call("GET", client.hold))
    assert await asyncio.to_thread(client.holding.wait, 10)
    return held


def queue_in_order(*calls: tuple[float | Rank | None, str], kube: KubeApi) -> list[asyncio.Task[Any]]:
    """Tasks making each call as the pass started at that time (a rank: of that queue; None:
    outside passes), created in this order; each submits its request in its first step, in
    creation order."""
    tasks = []
    for started, path in calls:
        token = PASS_RANK.set(rank(started) if not isinstance(started, tuple) else started)
        try:
            tasks.append(asyncio.create_task(kube.call("GET", path)))
        finally:
            PASS_RANK.reset(token)
    return tasks


async def test_a_started_pass_finishes_its_calls_before_a_flood_of_later_passes_calls():
    """Pass 1.0 makes a call, then 50 passes start and queue theirs, then pass 1.0 makes its next
    call: it is served next. On the FIFO pool it waited behind all 50, which at 1,000 jobs was
    longer than the pass's 120 s bound: no pass finished."""
    client = GatedClient(hold="/a/first")
    kube = KubeApi(client, threads=1)  # type: ignore[arg-type]
    try:
        held = await hold_the_only_thread(kube, client)
        flood = queue_in_order(*((2.0 + i, f"/b/{i}") for i in range(50)), kube=kube)
        (second,) = queue_in_order((1.0, "/a/second"), kube=kube)
        await asyncio.sleep(0)  # one loop turn: every task above runs its first step and queues its call
        client.release.set()
        await asyncio.gather(held, second, *flood)
        assert client.served[:2] == ["/a/first", "/a/second"]
        assert client.served[2:] == [f"/b/{i}" for i in range(50)]  # later passes: by their start
    finally:
        client.release.set()
        kube.close()


async def test_a_lease_call_is_served_ahead_of_a_backlog_of_passes_calls():
    """A call made outside any pass (the Lease renewal, a controller API access review) goes
    ahead of every queued pass call: a standby takes over when the Lease is not renewed."""
    client = GatedClient(hold="/a/first")
    kube = KubeApi(client, threads=1)  # type: ignore[arg-type]
    try:
        held = await hold_the_only_thread(kube, client)
        backlog = queue_in_order(*((1.0 + i / 100, f"/pass/{i}") for i in range(30)), kube=kube)
        (lease,) = queue_in_order((None, "/apis/coordination.k8s.io/v1/namespaces/ns/leases/leader"), kube=kube)
        await asyncio.sleep(0)  # one loop turn: every task above queues its call
        client.release.set()
        await asyncio.gather(held, lease, *backlog)
        assert client.served[1] == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/leader"
    finally:
        client.release.set()
        kube.close()


async def test_a_call_whose_pass_gave_up_is_never_sent():
    """A pass that timed out is cancelled with its calls still queued; they must not reach the
    API server (the FIFO pool dropped them too; the priority pool must not regress that)."""
    client = GatedClient(hold="/a/first")
    kube = KubeApi(client, threads=1)  # type: ignore[arg-type]
    try:
        held = await hold_the_only_thread(kube, client)
        gone, kept = queue_in_order((2.0, "/gone"), (3.0, "/kept"), kube=kube)
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.wait([gone])  # the cancel has reached the queued call (its future's callbacks ran)
        client.release.set()
        await asyncio.gather(held, kept)
        assert "/gone" not in client.served and client.served[-1] == "/kept"
    finally:
        client.release.set()
        kube.close()


async def test_errors_and_ok_statuses_come_back_through_the_pool():
    client = GatedClient(hold="/never")
    kube = KubeApi(client, threads=2)  # type: ignore[arg-type]
    try:
        assert await kube.call("GET", "/x/missing", ok=(404,)) is None
        with pytest.raises(NotFound):
            await kube.call("GET", "/x/missing")
        assert await kube.call("GET", "/x/there") == {}
    finally:
        kube.close()


async def test_every_call_of_a_pass_and_of_the_tasks_it_gathers_carries_its_start():
    """`JobRuntime.run_pass` marks the pass: the children step's applies and resync reads run in
    gathered sub-tasks, and each must queue as the pass, not as a call outside passes."""
    seen: list[Rank | None] = []

    class RankedKube(FakeKube):
        async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
            seen.append(PASS_RANK.get())
            return await super().apply(obj)

        async def patch_rljob_status(self, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
            seen.append(PASS_RANK.get())
            return await super().patch_rljob_status(ns, name, status)

    body, platform = rljob(), FakePlatform()
    kube = RankedKube(body)
    kube.platform = platform
    rt = JobRuntime(body=body, kube=kube, platform=platform, registry=JobRegistry(), metrics=Metrics(),
                    controller_url="http://op:8080", resync_seconds=5, clock=FakeClock(), engines=FakeEngines())
    await rt.run_pass()
    assert len(seen) >= 2 and None not in seen and len(set(seen)) == 1
    assert PASS_RANK.get() is None  # and the mark ends with the pass


def test_queue_order_outside_passes_first_then_by_pass_start_then_arrival():
    q: CallQueue[str] = CallQueue()
    q.push("pass 5 a", rank(5.0))
    q.push("pass 3 a", rank(3.0))
    q.push("lease", OUTSIDE_PASSES)
    q.push("pass 5 b", rank(5.0))
    q.push("pass 3 b", rank(3.0))
    q.push("review", rank(None))
    assert q.drain() == ["lease", "review", "pass 3 a", "pass 3 b", "pass 5 a", "pass 5 b"]
    assert len(q) == 0


def test_dropping_dead_items_keeps_the_order_of_the_rest():
    q: CallQueue[int] = CallQueue()
    for i in range(20):
        q.push(i, rank(float(20 - i)))
    assert q.keep(lambda i: i % 3 != 0) == 7
    assert q.drain() == [i for i in reversed(range(20)) if i % 3 != 0]


def test_the_pool_compacts_cancelled_calls_and_cancels_the_queue_on_shutdown():
    pool = PriorityPool(1, "t")
    gate, entered = threading.Event(), threading.Event()

    def hold() -> str:
        entered.set()
        gate.wait(10)
        return "held"

    first = pool.submit(hold, OUTSIDE_PASSES)
    assert entered.wait(10)
    dead = [pool.submit(lambda: None, rank(float(i))) for i in range(2 * PriorityPool.COMPACT_MIN - 1)]
    for f in dead:
        f.cancel()
    live = pool.submit(lambda: "live", rank(0.5))  # the queue doubled: cancelled calls are dropped
    assert pool.queued() == 1
    tail = pool.submit(lambda: "tail", rank(9e9))
    pool.shutdown()
    gate.set()
    assert first.result(10) == "held"
    assert live.cancelled() and tail.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None, OUTSIDE_PASSES)


def test_an_idle_thread_keeps_no_answer_of_its_last_call():
    """A pool thread waited for its next call with its last call (and so its answer) still bound
    in its frame: at rest, each of the 8 threads pinned a relist's LIST of every RLJob (10-18 MiB
    more RSS at 1,000 jobs, issue 13). Once the caller has dropped an answer, nothing keeps it."""

    class Answer:
        pass

    pool = PriorityPool(1, "t")
    future = pool.submit(Answer, OUTSIDE_PASSES)
    answer = weakref.ref(future.result(10))
    del future
    gc.collect()
    assert answer() is None, "the idle thread still holds its last answer"
    pool.shutdown()


def test_an_idle_thread_keeps_no_call_its_caller_gave_up():
    """A call whose caller gave up before a thread took it is skipped; the thread then waited for
    its next call still holding it (its request and body) until one came."""

    class Call:
        def __call__(self) -> None:
            raise AssertionError("a call its caller gave up was sent")

    pool = PriorityPool(1, "t")
    gate = threading.Event()
    busy = pool.submit(gate.wait, OUTSIDE_PASSES)
    call = Call()
    given_up = pool.submit(call, OUTSIDE_PASSES)
    assert given_up.cancel()
    held = weakref.ref(call)
    del call, given_up
    gate.set()
    assert busy.result(10) is True
    deadline = time.monotonic() + 5
    while held() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert held() is None, "the idle thread still holds a call its caller gave up"
    pool.shutdown()


async def test_a_converging_job_keeps_the_rank_of_the_pass_that_began_its_work():
    """A job becomes ready over several passes (create the pods; see them run, label the cells;
    write the status). At 1,000 RLJobs every job's first pass starts together, and ranking each
    pass by its own start put every job's second pass behind all the others' first passes: no
    cell was labelled Serving until nearly the whole fleet's pods were created. While its cells
    wait for pods, a job's passes keep the rank it began with; once settled, a pass ranks anew."""
    body, platform, clock = rljob(), FakePlatform(), FakeClock()
    kube = FakeKube(body)
    kube.platform = platform
    rt = JobRuntime(body=body, kube=kube, platform=platform, registry=JobRegistry(), metrics=Metrics(),
                    controller_url="http://op:8080", resync_seconds=5, clock=clock, engines=FakeEngines())
    ranks: list[tuple[float | None, float]] = []
    inner = rt._run_pass

    async def spy(started: float) -> float:
        r = PASS_RANK.get()
        ranks.append((r[1] if r else None, started))
        return await inner(started)

    rt._run_pass = spy  # type: ignore[method-assign]
    await rt.run_pass()  # creates the pods: the cells wait for them
    assert rt.controller is not None and any(c.state.name == "Pending" for c in rt.controller.fleet.all())
    await rt.run_pass()  # sees them run: Serving
    assert all(c.state.name == "Serving" for c in rt.controller.fleet.all())
    await rt.run_pass()  # settled: a pass of its own
    (r0, s0), (r1, s1), (r2, s2) = ranks
    assert r0 == s0 and r1 == s0 < s1, "the second pass continues the first one's work"
    assert r2 == s2 > s1, "a settled job's next pass queues as new work"


def test_a_job_converging_too_long_queues_as_a_new_pass_again():
    """An engine that never comes up must not keep its job at the front of the queue for good."""
    from rljob_operator.reconcile.job_runtime import CONVERGING_RANK_SECONDS

    rt = JobRuntime(body=rljob(), kube=FakeKube(rljob()), platform=FakePlatform(), registry=JobRegistry(),
                    metrics=Metrics(), controller_url="http://op:8080", resync_seconds=5, clock=FakeClock(),
                    engines=FakeEngines())
    rt._working_since = 100.0
    assert rt.queue_rank(100.0 + CONVERGING_RANK_SECONDS) == 100.0
    assert rt.queue_rank(100.0 + CONVERGING_RANK_SECONDS + 1) == 100.0 + CONVERGING_RANK_SECONDS + 1


async def test_an_edit_is_served_ahead_of_a_backlog_of_resync_checks_that_started_before_it():
    """At 1,000 jobs at rest the resync's drift reads are most of the pool's calls; ranked by start,
    an edit's calls queued behind every check that started before it. A check can wait: work
    goes first, however late it started."""
    client = GatedClient(hold="/a/first")
    kube = KubeApi(client, threads=1)  # type: ignore[arg-type]
    try:
        held = await hold_the_only_thread(kube, client)
        checks = queue_in_order(*(((RESYNC, 1.0 + i), f"/check/{i}") for i in range(40)), kube=kube)
        (edit,) = queue_in_order(((WORK, 100.0), "/edit"), kube=kube)
        (lease,) = queue_in_order((None, "/lease"), kube=kube)
        await asyncio.sleep(0)  # one loop turn: every task above queues its call
        client.release.set()
        await asyncio.gather(held, edit, lease, *checks)
        assert client.served[1:3] == ["/lease", "/edit"]
        assert client.served[3:] == [f"/check/{i}" for i in range(40)]  # checks: by their start
    finally:
        client.release.set()
        kube.close()


async def test_a_pass_of_a_job_at_rest_queues_as_a_resync_and_an_edit_or_a_poke_as_work():
    """What decides the queue of a pass's calls (`JobRuntime.resyncing`): a pass whose timer ran
    out with nothing new is a resync; an edit (even one no watch event announced: the relist's),
    a poke (a pod event, a probe's verdict) and a job whose cells wait are work."""
    body, platform, clock = rljob(), FakePlatform(), FakeClock()
    rt, _, _ = runtime(body, platform, clock)
    queues: list[int] = []
    inner = rt._run_pass

    async def spy(started: float) -> float:
        r = PASS_RANK.get()
        assert r is not None
        queues.append(r[0])
        return await inner(started)

    rt._run_pass = spy  # type: ignore[method-assign]
    await rt.run_pass()
    assert queues == [WORK], "a job's first pass is work"
    await settle(rt)
    queues.clear()
    await rt.run_pass()
    await rt.run_pass()
    assert queues == [RESYNC, RESYNC], "a job at rest: its passes only check"
    rt.poke()
    await rt.run_pass()
    await rt.run_pass()
    assert queues[2:] == [WORK, RESYNC], "a poke makes the next pass work, and only that one"
    body["metadata"]["generation"] = 2
    body["spec"]["inference"]["replicas"] = 3  # edited in place: no watch event, no poke
    await rt.run_pass()
    assert queues[4] == WORK and rt.controller is not None
    assert any(c.state.name == "Pending" for c in rt.controller.fleet.all())
    await rt.run_pass()
    assert queues[5] == WORK, "the new cell waits for its pods: its job's passes are work"


def test_the_pool_tells_whether_work_other_than_resyncs_waits():
    """What the children's drift check asks before it queues its reads (`children.py`)."""
    pool = PriorityPool(1, "t")
    gate, entered = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        gate.wait(10)

    try:
        pool.submit(hold, OUTSIDE_PASSES)
        assert entered.wait(10)
        assert not pool.work_waiting()
        pool.submit(lambda: None, rank(1.0, RESYNC))
        assert not pool.work_waiting(), "only resyncs wait"
        pool.submit(lambda: None, rank(5.0))
        assert pool.work_waiting()
    finally:
        gate.set()
        pool.shutdown()
