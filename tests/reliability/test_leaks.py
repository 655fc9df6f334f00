"""Every asyncio task and file descriptor a job's life opens in the operator closes with it.

Fault: none; the ordinary life of a job, over and over (create, scale 1 -> 2, suspend, resume,
SIGKILL an engine, a weight-update window through the controller API, delete).
Expectation: once the jobs are gone, the operator's asyncio tasks and open fds come back down
to their floor before them.

The hour's soak (bench/soak.py, RESULTS.md) samples with a job alive, where ~24 fds and ~53
tasks move by a few with the probes and passes in flight: at that noise its fit could neither
show nor rule out a leak of one fd or task per job. Here the question is exact. The floor is the
lowest count over FLOOR_SECONDS of scrapes with no job, taken after one warm-up job, so that
what the operator creates once and keeps (the probes' HTTP session, the controller API's
caches) is in it. Measured here: a deleted job's tasks go within ~6 s (kopf's per-object
worker waits out its idle timeout), 50 -> 42; fds move 20-22 with the API calls in flight. A
leak of one per job stays above the floor for good after the next jobs (a task leaked on
purpose per job fails this test). The idle count has to be flat for the lowest count to be the
floor: the leader's wait tasks once existed only between its renewals, so a scrape during a
slow renewal (a busy CI machine) read 2 below the idle count, and that floor failed this test
with no leak (controller_runtime.clock.ticks now holds them through each round). A failure
names the coroutines above their count at the floor (rljob_operator_asyncio_tasks_by_coroutine).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.cluster.waiting import WaitTimeout, wait_for
from tests.integration.operator_harness import Kube, control_rbac, install_crd, make_rljob, release_rljobs
from tests.reliability.test_soak_smoke import load_soak

JOB = "leak-j"
JOBS_AFTER_WARMUP = 4  # a leak of one per job: +4 over the floor
FLOOR_SECONDS = 12.0  # longer than a deleted job's tasks take to end (~6 s)
SCRAPE_SECONDS = 0.5


def one_job_life(soak: Any) -> None:
    """bench/soak.py's steps, on one job that goes as it came."""
    soak.cycles += 1
    soak.kube.apply(make_rljob(JOB, replicas=1, standin_cells="all"))
    soak.ready(JOB, 1)
    soak.scale(JOB, 2)
    soak.suspend(JOB)
    soak.resume(JOB)  # before the window: cells made after one wait for the next
    soak.kill_engine(JOB, 2)
    soak.window(JOB)
    soak.ready(JOB, 2)
    soak.delete(JOB)


def floor(soak: Any) -> tuple[float, int, dict[str, float]]:
    """The lowest (tasks, fds) over FLOOR_SECONDS of scrapes (a sampling period, not a wait),
    and the tasks by coroutine at the lowest task count."""
    samples = []
    end = time.monotonic() + FLOOR_SECONDS
    while time.monotonic() < end:
        samples.append(soak.sample())
        time.sleep(SCRAPE_SECONDS)
    lowest = min((s for s in samples if s.tasks is not None), key=lambda s: s.tasks)
    return lowest.tasks, min(s.fds for s in samples), lowest.by_coroutine


def above(now: dict[str, float], then: dict[str, float]) -> dict[str, float]:
    """Coroutines with more tasks now than then, by how many."""
    return {k: n - then.get(k, 0.0) for k, n in sorted(now.items()) if n > then.get(k, 0.0)}


@pytest.mark.timeout(300)
def test_a_jobs_tasks_and_fds_close_with_it(cluster, namespace, tmp_path) -> None:
    soak_mod = load_soak()
    kube = Kube(cluster, namespace)
    install_crd(cluster)
    control_rbac(kube, JOB)
    soak = soak_mod.Soak(cluster, kube, tmp_path)
    soak.start_operator()
    try:
        one_job_life(soak)  # warm-up: what the operator makes once and keeps
        tasks0, fds0, census0 = floor(soak)
        for _ in range(JOBS_AFTER_WARMUP):
            one_job_life(soak)

        last: list[Any] = []

        def back_to_floor() -> tuple[float | None, int] | None:
            s = soak.sample()
            last[:] = [s]
            return (s.tasks, s.fds) if s.tasks is not None and s.tasks <= tasks0 and s.fds <= fds0 else None

        try:
            wait_for(back_to_floor, 90, interval=0.5)
        except WaitTimeout:
            s = last[0]
            raise AssertionError(
                f"after {JOBS_AFTER_WARMUP} more jobs: {s.tasks} tasks (floor {tasks0}), {s.fds} fds"
                f" (floor {fds0}); coroutines above their count at the floor:"
                f" {above(s.by_coroutine, census0)}"
            ) from None
        assert soak.op is not None
        soak.op.healthz()
        assert soak.failures == []
    finally:
        if soak.op is not None:
            soak.op.stop()
        release_rljobs(cluster, namespace)
