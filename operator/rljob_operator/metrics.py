"""Prometheus metrics of the operator, on a registry of its own.

A private `CollectorRegistry` keeps tests independent (each builds its own `Metrics`) and
keeps library metrics we did not choose out of `/metrics`.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
STATES = ("Pending", "Starting", "PendingWeights", "Serving", "Offloaded", "Unhealthy", "Failed")


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.reconciles = Counter("rljob_reconcile_total", "Reconcile passes.", ["namespace", "job"], registry=r)
        self.reconcile_errors = Counter("rljob_reconcile_errors_total", "Reconcile passes that raised.", ["namespace", "job", "step"], registry=r)
        self.reconcile_seconds = Histogram(
            "rljob_reconcile_duration_seconds", "Duration of one reconcile pass.", ["namespace", "job"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r,
        )
        self.cells = Gauge("rljob_cells", "Engine cells by state.", ["namespace", "job", "state"], registry=r)
        self.probe_seconds = Histogram(
            "rljob_health_probe_duration_seconds", "Latency of engine health probes.", ["namespace", "job"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r,
        )
        self.weight_update_seconds = Histogram(
            "rljob_weight_update_duration_seconds", "From start_update_weights to end_update_weights.", ["namespace", "job"],
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600), registry=r,
        )
        self.restarts = Counter("rljob_cell_restarts_total", "Engine cells recreated.", ["namespace", "job"], registry=r)
        self.api_calls = Counter("rljob_controller_api_calls_total", "Controller API calls.", ["verb", "code"], registry=r)
        self.api_seconds = Histogram("rljob_controller_api_duration_seconds", "Controller API call latency.", ["verb"], registry=r)
        self.leader = Gauge("rljob_operator_leader", "1 while this replica holds the leader Lease.", registry=r)
        self.jobs = Gauge("rljob_jobs", "RLJobs with a running controller on this replica.", registry=r)

    def set_cells(self, namespace: str, job: str, states: Iterable[str]) -> None:
        counts = Tally(states)
        for s in STATES:
            self.cells.labels(namespace, job, s).set(counts.get(s, 0))

    def forget_job(self, namespace: str, job: str) -> None:
        for s in STATES:
            try:
                self.cells.remove(namespace, job, s)
            except KeyError:
                pass

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
