"""Which queued Kubernetes call a free thread of `kubeapi.KubeApi` serves next, and the threads.

Every job's passes share one pool of a few threads (`main.API_THREADS`: more threads starved the
Lease on 2 cores). As one FIFO it livelocked at 1,000 RLJobs (bench/RESULTS.md, "N=1,000,
RLJobs only: it stalls"): once the backlog took longer to drain than the controller's 120 s
pass bound, every pass timed out with its later calls still queued behind newer passes' calls,
was retried with a new batch of calls at the back, and timed out again; no pass finished, so
nothing the API server was asked served any job.

So the queue is ordered by who asked, not by when:

1. calls made outside any pass (the leader Lease, the controller API's token and access reviews
   and its status writes, the relist): first, in arrival order. They are few and each is on
   someone's critical path (a standby takes over when the Lease is not renewed; a trainer waits
   on its control call);
2. calls of a pass, ordered by the pass's rank (`in_pass`), then arrival order. The rank is when
   the pass started, or, while its job is still converging (cells waiting for pods), when the
   pass that began that work started (`JobRuntime.queue_rank`): a job becomes ready over a few
   passes, and each of them ranks as its first. Work that has started is served before work
   that started after it, so the oldest passes finish within their bound and a flood of new
   passes waits its turn instead of making every pass late. Calls of a pass that timed out
   anyway were cancelled with it and are dropped, never sent.

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
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# The running pass's rank: when the work it continues started (a perf_counter reading); None outside passes.
PASS_STARTED: ContextVar[float | None] = ContextVar("rljob_pass_started", default=None)

Rank = tuple[int, float]
OUTSIDE_PASSES: Rank = (0, 0.0)


def rank(pass_started: float | None) -> Rank:
    """The queue rank of a call made by the pass started at `pass_started` (None: no pass)."""
    return OUTSIDE_PASSES if pass_started is None else (1, pass_started)


def current_rank() -> Rank:
    """The rank of a call made here and now (from the running task's context)."""
    return rank(PASS_STARTED.get())


@contextmanager
def in_pass(started: float) -> Iterator[None]:
    """Mark the calls made inside (and in tasks created inside) as the pass started at `started`."""
    token = PASS_STARTED.set(started)
    try:
        yield
    finally:
        PASS_STARTED.reset(token)


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


class PriorityPool:
    """`threads` worker threads serving a `CallQueue` of blocking calls.

    Like `concurrent.futures.ThreadPoolExecutor` (a cancelled future that no thread took yet is
    never run), but a free thread takes the lowest rank, not the oldest submission. Cancelled
    calls stay queued until a thread reaches them or the queue is compacted, which happens when
    it has doubled since the last compaction (a flood of passes that timed out behind the
    others must not keep their bodies in memory)."""

    COMPACT_MIN = 1024

    def __init__(self, threads: int, name: str = "kubeapi") -> None:
        if threads < 1:
            raise ValueError("a pool needs at least one thread")
        self._cv = threading.Condition()
        self._queue: CallQueue[_Work] = CallQueue()
        self._closed = False
        self._compact_at = self.COMPACT_MIN
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def queued(self) -> int:
        """Calls waiting for a thread (cancelled ones not yet dropped included)."""
        with self._cv:
            return len(self._queue)

    def submit(self, fn: Callable[[], Any], rank_: Rank) -> Future[Any]:
        future: Future[Any] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            self._queue.push(_Work(future, fn), rank_)
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
            if not work.future.set_running_or_notify_cancel():
                continue  # its caller gave up (a pass that timed out): never sent
            try:
                result = work.fn()
            except BaseException as e:
                work.future.set_exception(e)
            else:
                work.future.set_result(result)
