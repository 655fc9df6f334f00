"""Prometheus metrics of the operator, on a registry of its own.

A private `CollectorRegistry` keeps tests independent (each builds its own `Metrics`) and
keeps library metrics we did not choose out of `/metrics`.

Every family is one row of `SPECS` (name, type, labels, help): the README's metrics table, the
alert rules and the dashboard are checked against that table, so a renamed metric cannot leave
a panel or an alert silently empty. Counters and histograms are updated where things happen;
the per-job gauges are computed at scrape time from the last status the operator wrote
(`JobGauges`), so ages (last probe, lock held) are current on every scrape rather than as old
as the last status write.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from controller_runtime.clock import Clock, RealClock
from controller_runtime.events import ControllerEvent
from controller_runtime.metric_specs import CELL, JOB, MetricSpec, build_metric
from rljob_operator.job_gauges import JobSnapshot, job_samples
from rljob_operator.kube.api_pool import QUEUE_NAMES, Rank

CONTENT_TYPE = CONTENT_TYPE_LATEST


SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("rljob_operator_leader", "gauge", (), "1 while this replica holds the leader Lease."),
    MetricSpec("rljob_jobs", "gauge", (), "RLJobs with a running controller on this replica."),
    MetricSpec(
        "rljob_operator_asyncio_tasks",
        "gauge",
        (),
        "asyncio tasks alive on the operator's event loop, counted at scrape time.",
    ),
    MetricSpec(
        "rljob_operator_asyncio_tasks_by_coroutine",
        "gauge",
        ("coroutine",),
        "The same tasks by the coroutine each runs (module.qualname): which code a rising count is in.",
    ),
    MetricSpec(
        "rljob_job_phase",
        "gauge",
        (*JOB, "phase"),
        "1 for the job's current phase (Pending ... Failed), 0 for the others.",
    ),
    MetricSpec(
        "rljob_job_failed",
        "gauge",
        (*JOB, "reason"),
        "1 while the job is Failed, labelled with its Failed condition's reason.",
    ),
    MetricSpec("rljob_cells", "gauge", (*JOB, "state"), "Engine cells per state (Pending ... Failed)."),
    MetricSpec(
        "rljob_weight_version",
        "gauge",
        JOB,
        "Weight version the serving engines hold (numeric versions only).",
    ),
    MetricSpec("rljob_rollout_id", "gauge", JOB, "Last rollout id handed to the trainers."),
    MetricSpec(
        "rljob_cell_restarts_used",
        "gauge",
        CELL,
        "Recreations of the cell so far, counted against maxRestarts.",
    ),
    MetricSpec(
        "rljob_cell_restarts_remaining",
        "gauge",
        CELL,
        "Recreations the cell may still have (maxRestarts minus used).",
    ),
    MetricSpec(
        "rljob_cell_last_probe_age_seconds", "gauge", CELL, "Seconds since the cell's engine was last probed."
    ),
    MetricSpec(
        "rljob_cell_consecutive_probe_failures",
        "gauge",
        CELL,
        "Failed health probes of the cell in a row, live (status carries the count only with other changes).",
    ),
    MetricSpec(
        "rljob_lock_held_seconds",
        "gauge",
        JOB,
        "Seconds the open weight-update window has held the lock (0 when none is open).",
    ),
    MetricSpec(
        "rljob_lock_overdue_seconds",
        "gauge",
        JOB,
        "Seconds the open window's lock is past its expiry (0 when none is, or none is open).",
    ),
    MetricSpec("rljob_cell_restarts_total", "counter", JOB, "Engine cells recreated."),
    MetricSpec(
        "rljob_weight_update_windows_total",
        "counter",
        (*JOB, "outcome"),
        "Weight-update windows closed, by outcome: completed, aborted, expired, check_failed.",
    ),
    MetricSpec(
        "rljob_weight_update_duration_seconds",
        "histogram",
        JOB,
        "From start_update_weights to end_update_weights.",
        (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    ),
    MetricSpec(
        "rljob_health_probe_duration_seconds",
        "histogram",
        JOB,
        "Latency of engine health probes.",
        (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    ),
    MetricSpec("rljob_reconcile_total", "counter", JOB, "Reconcile passes."),
    MetricSpec(
        "rljob_reconcile_errors_total", "counter", (*JOB, "step"), "Reconcile passes that raised, by step."
    ),
    MetricSpec(
        "rljob_reconcile_duration_seconds",
        "histogram",
        JOB,
        "Duration of one reconcile pass.",
        (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    ),
    MetricSpec(
        "rljob_controller_api_calls_total",
        "counter",
        ("verb", "code"),
        "Controller API calls by HTTP status.",
    ),
    MetricSpec(
        "rljob_controller_api_duration_seconds",
        "histogram",
        ("verb",),
        "Controller API call latency.",
        (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10),
    ),
    MetricSpec(
        "rljob_operator_pod_watch_events_total",
        "counter",
        ("type",),
        "Engine pods the operator's pod watch received, by event type (LISTED: from a LIST; ADDED, "
        "MODIFIED, DELETED, BOOKMARK).",
    ),
    MetricSpec(
        "rljob_operator_pod_watch_restarts_total",
        "counter",
        ("reason",),
        "Engine pod watch requests started again, by why the last one ended: ended (the server's "
        "timeout), gone (410: listed again), timeout (the client gave up a silent stream), error.",
    ),
    MetricSpec(
        "rljob_kube_api_queued",
        "gauge",
        (),
        "Kubernetes API calls of the reconcile passes waiting for a thread of the operator's pool, at scrape time.",
    ),
    MetricSpec(
        "rljob_kube_api_queue_wait_seconds",
        "histogram",
        ("queue",),
        "How long a Kubernetes API call waited for a thread of the pool, by queue: outside (not a pass), "
        "work, resync (a check of a job at rest).",
        (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    ),
)
# Families computed at scrape time from the last written status.
SCRAPED = tuple(s for s in SPECS if s.labels[:2] == JOB and s.type == "gauge")
TASK_CENSUS = next(s for s in SPECS if s.name == "rljob_operator_asyncio_tasks_by_coroutine")


class JobGauges(Collector):
    """The per-job gauges, computed from each job's last written status when scraped."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.jobs: dict[tuple[str, str], JobSnapshot] = {}

    def collect(self) -> Iterator[Metric]:
        families = {s.name: GaugeMetricFamily(s.name, s.help, labels=s.labels) for s in SCRAPED}
        now = self.clock.now()
        for (namespace, job), snap in sorted(self.jobs.items()):
            for name, labels, value in job_samples(snap, now):
                families[name].add_metric([namespace, job, *labels], value)
        yield from families.values()

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(s.name, s.help, labels=s.labels) for s in SCRAPED]


def asyncio_task_count() -> float:
    """Tasks alive on the running loop (0 outside one). /metrics is served on the operator's own
    loop, so a scrape counts the operator's tasks: a task leaked per job, window or restart (a
    probe or watch never cancelled) shows as a line that keeps rising."""
    try:
        return float(len(asyncio.all_tasks(asyncio.get_running_loop())))
    except RuntimeError:
        return 0.0


def coroutine_name(task: asyncio.Task[Any]) -> str:
    """module.qualname of the code a task runs: bounded by the code, never by jobs or objects
    (task names carry job names), so it can be a label."""
    coro: Any = task.get_coro()
    frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
    module = frame.f_globals.get("__name__", "?") if frame is not None else "?"
    return f"{module}.{getattr(coro, '__qualname__', type(coro).__name__)}"


class TaskCensus(Collector):
    """The loop's tasks by coroutine, counted when scraped (nothing kept between scrapes): a
    leak test that sees the total above its floor can say which code holds the extra tasks."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(TASK_CENSUS.name, TASK_CENSUS.help, labels=TASK_CENSUS.labels)
        try:
            tasks = asyncio.all_tasks(asyncio.get_running_loop())
        except RuntimeError:
            tasks = set()
        for name, n in sorted(Counter(coroutine_name(t) for t in tasks).items()):
            family.add_metric([name], n)
        yield family

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(TASK_CENSUS.name, TASK_CENSUS.help, labels=TASK_CENSUS.labels)]


class Metrics:
    def __init__(self, clock: Clock | None = None) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.job_gauges = JobGauges(clock or RealClock())
        built: dict[str, Any] = {
            s.name: build_metric(s, r) for s in SPECS if s not in SCRAPED and s is not TASK_CENSUS
        }
        r.register(self.job_gauges)
        r.register(TaskCensus())
        # Counters and histograms labelled by job: their series of a deleted job are dropped
        # with it (forget_job). Kept, every job ever reconciled would add its series for good: the
        # operator's memory and /metrics would grow with churn.
        self.per_job = [built[s.name] for s in SPECS if s.name in built and s.labels[:2] == JOB]
        self.reconciles = built["rljob_reconcile_total"]
        self.reconcile_errors = built["rljob_reconcile_errors_total"]
        self.reconcile_seconds = built["rljob_reconcile_duration_seconds"]
        self.probe_seconds = built["rljob_health_probe_duration_seconds"]
        self.weight_update_seconds = built["rljob_weight_update_duration_seconds"]
        self.windows = built["rljob_weight_update_windows_total"]
        self.restarts = built["rljob_cell_restarts_total"]
        self.api_calls = built["rljob_controller_api_calls_total"]
        self.api_seconds = built["rljob_controller_api_duration_seconds"]
        self.leader = built["rljob_operator_leader"]
        self.jobs = built["rljob_jobs"]
        self.asyncio_tasks = built["rljob_operator_asyncio_tasks"]
        self.asyncio_tasks.set_function(asyncio_task_count)
        self.kube_api_queued = built["rljob_kube_api_queued"]
        self.kube_api_queue_wait = built["rljob_kube_api_queue_wait_seconds"]
        self._queue_waits = [self.kube_api_queue_wait.labels(q) for q in QUEUE_NAMES]
        self.pod_watch_events = built["rljob_operator_pod_watch_events_total"]
        self.pod_watch_restarts = built["rljob_operator_pod_watch_restarts_total"]
        self._pod_watch_counters: dict[str, Any] = {}

    def count_pod_watch_event(self, type_: str) -> None:
        """One engine pod event (`list_watch`): the labelled child is looked up once per type."""
        child = self._pod_watch_counters.get(type_)
        if child is None:
            child = self._pod_watch_counters[type_] = self.pod_watch_events.labels(type_)
        child.inc()

    def count_pod_watch_restart(self, reason: str) -> None:
        self.pod_watch_restarts.labels(reason).inc()

    def observe_queue_wait(self, rank: Rank, seconds: float) -> None:
        """A pool call's wait for a thread (`api_pool.PriorityPool`'s `on_wait`; any thread)."""
        self._queue_waits[rank[0]].observe(seconds)

    def set_max_restarts(self, namespace: str, job: str, max_restarts: int) -> None:
        snap = self.job_gauges.jobs.setdefault((namespace, job), JobSnapshot())
        snap.max_restarts = max_restarts

    def observe_status(self, namespace: str, job: str, status: Mapping[str, Any]) -> None:
        """Remember the status just written; the job's gauges are computed from it when scraped."""
        snap = self.job_gauges.jobs.setdefault((namespace, job), JobSnapshot())
        snap.status = dict(status)

    def count_event(self, namespace: str, job: str, event: ControllerEvent) -> None:
        """Count what a controller event closes or replaces."""
        if event.outcome is not None:
            self.windows.labels(namespace, job, event.outcome).inc()

    def forget_job(self, namespace: str, job: str) -> None:
        """The job is gone from this replica: its gauges and its labelled series go too."""
        self.job_gauges.jobs.pop((namespace, job), None)
        for metric in self.per_job:
            metric.remove_by_labels({"namespace": namespace, "job": job})

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
