"""Which queued Kubernetes call a free thread of `kubeapi.KubeApi` serves next, and the threads.

Every job's passes share one pool of a few threads (`main.API_THREADS`: more threads starve the
Lease on a small machine). As one FIFO it livelocks on a large fleet: once the backlog takes
longer to drain than the controller's pass bound, every pass times out with its later calls
still queued behind newer passes' calls, is retried with a new batch of calls at the back, and
times out again; no pass finishes, so nothing the API server is asked serves any job.

So the queue is ordered by who asked, not by when:

1. calls made outside any pass (the leader Lease, the controller API's token and access reviews
   and its status writes, the relist): first, in arrival order. They are few and each is on
   someone's critical path (a standby takes over when the Lease is not renewed; a trainer waits
   on its control call);
2. calls of a pass that acts on news (a spec edit, a pod or a probe that woke it, a job still
   converging, a retry after an error), ordered by the pass's rank (`in_pass`), then arrival
   order. The rank is when the pass started, or, while its job is still converging (cells
   waiting for pods), when the pass that began that work started (`JobRuntime.queue_rank`): a
   job becomes ready over a few passes, and each of them ranks as its first. Work that has
   started is served before work that started after it, so the oldest passes finish within
   their bound and a flood of new passes waits its turn instead of making every pass late.
   Calls of a pass that timed out anyway were cancelled with it and are dropped, never sent;
3. calls of a resync: a pass that only checks a job at rest (its timer ran out, nothing woke
   it), by the same order. A check can wait; an edit, a dead engine's replacement, a job
   becoming ready should not, and ranked by start an edit queued behind every check that
   started before it. On a fleet at rest the checks (the children's drift reads) are most of
   the pool's calls; this order matters when the pool backs up: a slower API server, more jobs.

The rank travels in a context variable set by `JobRuntime.run_pass`, so it reaches every call
of the pass, those of sub-tasks it gathers or spawns included (asyncio copies the context into
each task it creates): the probe tasks a pass starts, and their serving-label writes, keep that
pass's rank, which is what they are: the rest of its work.

`CallQueue` is the pure ordering (no threads, no I/O); `PriorityPool` runs it on threads.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Rank = tuple[int, float]  # (queue, when the work began: a perf_counter reading)
OUTSIDE, WORK, RESYNC = 0, 1, 2  # the queues, served in this order
QUEUE_NAMES = ("outside", "work", "resync")  # the metrics' label for each
OUTSIDE_PASSES: Rank = (OUTSIDE, 0.0)

# The running pass's rank; None outside passes.
PASS_RANK: ContextVar[Rank | None] = ContextVar("rljob_pass_rank", default=None)


def rank(pass_started: float | None, queue: int = WORK) -> Rank:
    """The queue rank of a call made by the pass started at `pass_started` (None: no pass)."""
    return OUTSIDE_PASSES if pass_started is None else (queue, pass_started)


def current_rank() -> Rank:
    """The rank of a call made here and now (from the running task's context)."""
    return PASS_RANK.get() or OUTSIDE_PASSES


@contextmanager
def in_pass(started: float, *, resync: bool = False) -> Iterator[None]:
    """Mark the calls made inside (and in tasks created inside) as the pass started at `started`,
    a resync (`resync`) or work."""
    token = PASS_RANK.set(rank(started, RESYNC if resync else WORK))
    try:
        yield
    finally:
        PASS_RANK.reset(token)


@dataclass(order=True)
class _Entry(Generic[T]):
    rank: Rank
    seq: int
    item: T = field(compare=False)


class CallQueue(Generic[T]):
    """Items served lowest rank first, then first in first out. Not thread-safe (the pool locks)."""

    def __init__(self) -> None:
        self._heap: list[_Entry[T]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: T, rank_: Rank) -> None:
        heapq.heappush(self._heap, _Entry(rank_, next(self._seq), item))

    def front(self) -> Rank | None:
        """The rank served next (a cancelled item's included); None when empty."""
        return self._heap[0].rank if self._heap else None

    def pop(self) -> T:
        """The item to serve next (IndexError when empty)."""
        return heapq.heappop(self._heap).item

    def keep(self, alive: Callable[[T], bool]) -> int:
        """Drop the items `alive` says are dead (cancelled calls); the order of the rest holds.
        Returns how many were dropped."""
        before = len(self._heap)
        self._heap = [e for e in self._heap if alive(e.item)]
        heapq.heapify(self._heap)
        return before - len(self._heap)

    def drain(self) -> list[T]:
        """Every item, in serving order, leaving the queue empty."""
        items = [heapq.heappop(self._heap).item for _ in range(len(self._heap))]
        return items


@dataclass
class _Work:
    future: Future[Any]
    fn: Callable[[], Any]
    rank: Rank
    queued_at: float


WaitObserver = Callable[[Rank, float], None]


class PriorityPool:
    """`threads` worker threads serving a `CallQueue` of blocking calls.

    Like `concurrent.futures.ThreadPoolExecutor` (a cancelled future that no thread took yet is
    never run), but a free thread takes the lowest rank, not the oldest submission. Cancelled
    calls stay queued until a thread reaches them or the queue is compacted, which happens when
    it has doubled since the last compaction (a flood of passes that timed out behind the
    others must not keep their bodies in memory)."""

    COMPACT_MIN = 1024

    def __init__(self, threads: int, name: str = "kubeapi", on_wait: WaitObserver | None = None) -> None:
        """`on_wait(rank, seconds)` is told, on the serving thread, how long each call waited."""
        if threads < 1:
            raise ValueError("a pool needs at least one thread")
        self._cv = threading.Condition()
        self._queue: CallQueue[_Work] = CallQueue()
        self._closed = False
        self._compact_at = self.COMPACT_MIN
        self._on_wait = on_wait
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def queued(self) -> int:
        """Calls waiting for a thread (cancelled ones not yet dropped included)."""
        with self._cv:
            return len(self._queue)

    def work_waiting(self) -> bool:
        """Whether a call that is not a resync's waits for a thread."""
        with self._cv:
            front = self._queue.front()
        return front is not None and front[0] < RESYNC

    def submit(self, fn: Callable[[], Any], rank_: Rank) -> Future[Any]:
        future: Future[Any] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            self._queue.push(_Work(future, fn, rank_, time.perf_counter()), rank_)
            if len(self._queue) >= 2 * self._compact_at:
                self._queue.keep(lambda w: not w.future.cancelled())
                self._compact_at = max(self.COMPACT_MIN, len(self._queue))
            self._cv.notify()
        return future

    def shutdown(self) -> None:
        """Cancel what is queued and let the threads end after their current call."""
        with self._cv:
            self._closed = True
            for work in self._queue.drain():
                work.future.cancel()
            self._cv.notify_all()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                work = self._queue.pop()
            # else its caller gave up (a pass that timed out): never sent
            if work.future.set_running_or_notify_cancel():
                if self._on_wait is not None:
                    self._on_wait(work.rank, time.perf_counter() - work.queued_at)
                _run(work)
            # An idle thread waits for the next call with this frame alive: kept, `work` (its
            # future holds the answer) would pin each thread's last answer until its next call:
            # at rest, the relist's LIST of every RLJob, on up to every thread of the pool.
            # A call given up is dropped too (its request, body included).
            del work


def _run(work: _Work) -> None:
    """Call `work.fn` and hand its answer or error to the caller's future."""
    try:
        result = work.fn()
    except BaseException as e:
        work.future.set_exception(e)
    else:
        work.future.set_result(result)
