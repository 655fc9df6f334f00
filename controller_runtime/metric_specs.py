"""One row per exported Prometheus family, shared by the operator, the executor and the trainer.

Each process keeps its families in a table of `MetricSpec`; the README's metrics table, the
alert rules and the dashboard are tested against the union of those tables, so a metric is
renamed in one place and a stale panel or alert fails a test instead of going quietly empty.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# `_created` series would double every counter and histogram as a gauge that no rule or
# panel reads (the text format gives Prometheus no use for them); off for every registry.
disable_created_metrics()  # type: ignore[no-untyped-call]

JOB = ("namespace", "job")
CELL = ("namespace", "job", "cell")


@dataclass(frozen=True)
class MetricSpec:
    name: str  # as exported (counters with their `_total`)
    type: str  # counter, gauge or histogram
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()

    @property
    def family(self) -> str:
        """The name prometheus_client registers (a counter without `_total`)."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name


def build_metric(spec: MetricSpec, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
    if spec.type == "counter":
        return Counter(spec.family, spec.help, spec.labels, registry=registry)
    if spec.type == "histogram":
        return Histogram(spec.name, spec.help, spec.labels, buckets=spec.buckets, registry=registry)
    return Gauge(spec.name, spec.help, spec.labels, registry=registry)
