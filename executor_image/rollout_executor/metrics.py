"""The RolloutExecutor's Prometheus metrics, served as `GET /metrics` on its data channel.

The executor runs inside a Ray actor; its data channel is the one HTTP server that already
listens there, so `/metrics` lives beside `/healthz` on it (unauthenticated, like any
exporter: it carries counts, never samples). Counters and histograms are updated as samples
are scored and batches delivered; what the generator already counts (requests in flight,
retried) is read from it when scraped, so there is one count and not two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller_runtime.metric_specs import JOB, MetricSpec, build_metric

SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("rljob_executor_samples_generated_total", "counter", JOB, "Samples generated and scored."),
    MetricSpec(
        "rljob_executor_samples_per_second",
        "gauge",
        JOB,
        "Samples per second of the last completed rollout (generation and scoring).",
    ),
    MetricSpec(
        "rljob_executor_batch_staleness_versions",
        "histogram",
        JOB,
        "Weight versions each sample of a delivered batch lags the current version.",
        (0, 1, 2, 3, 4, 8, 16),
    ),
    MetricSpec(
        "rljob_executor_last_batch_staleness_versions",
        "gauge",
        JOB,
        "Largest lag (weight versions) in the last delivered batch.",
    ),
    MetricSpec(
        "rljob_executor_max_staleness_versions",
        "gauge",
        JOB,
        "spec.rollout.maxStaleness: the lag a sample may have.",
    ),
    MetricSpec(
        "rljob_executor_last_batch_reward_mean", "gauge", JOB, "Mean reward of the last delivered batch."
    ),
    MetricSpec(
        "rljob_executor_shards_served_total",
        "counter",
        JOB,
        "Shards handed to trainer ranks over the HTTP side channel (data_url).",
    ),
    MetricSpec(
        "rljob_executor_requests_in_flight",
        "gauge",
        JOB,
        "Generation requests sent to engines and not answered yet.",
    ),
    MetricSpec(
        "rljob_executor_requests_retried_total",
        "counter",
        JOB,
        "Generation requests retried (engine error, weight update).",
    ),
    MetricSpec(
        "rljob_executor_eval_reward_mean", "gauge", (*JOB, "fleet"), "Mean reward of the last evaluation."
    ),
    MetricSpec("rljob_executor_eval_pass_at_1", "gauge", (*JOB, "fleet"), "pass@1 of the last evaluation."),
    MetricSpec(
        "rljob_executor_sample_failures_total",
        "counter",
        (*JOB, "source", "reason"),
        "Samples whose reward (source=reward) or rollout function (source=rollout) raised, timed out or "
        "returned a malformed sample.",
    ),
)
BY_NAME = {s.name: s for s in SPECS}
SCRAPED = ("rljob_executor_requests_in_flight", "rljob_executor_requests_retried_total")


class GeneratorCounts(Collector):
    """Requests in flight and retried, read from the generator's own counts when scraped."""

    def __init__(self, labels: Sequence[str], read: Callable[[], tuple[int, int]]) -> None:
        self.labels = list(labels)
        self.read = read

    def collect(self) -> Iterator[Metric]:
        in_flight, retried = self.read()
        g = GaugeMetricFamily(SCRAPED[0], BY_NAME[SCRAPED[0]].help, labels=JOB)
        g.add_metric(self.labels, in_flight)
        c = CounterMetricFamily(BY_NAME[SCRAPED[1]].family, BY_NAME[SCRAPED[1]].help, labels=JOB)
        c.add_metric(self.labels, retried)
        yield g
        yield c


class ExecutorMetrics:
    def __init__(
        self, namespace: str, job: str, max_staleness: int, read_requests: Callable[[], tuple[int, int]]
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = (namespace, job)
        built: dict[str, Any] = {
            s.name: build_metric(s, self.registry) for s in SPECS if s.name not in SCRAPED
        }
        self.registry.register(GeneratorCounts(self.labels, read_requests))
        self._m = built
        built["rljob_executor_max_staleness_versions"].labels(*self.labels).set(max_staleness)
        built["rljob_executor_samples_generated_total"].labels(*self.labels)  # exported from 0 on
        built["rljob_executor_shards_served_total"].labels(*self.labels)

    def sample_scored(self) -> None:
        self._m["rljob_executor_samples_generated_total"].labels(*self.labels).inc()

    def sample_failed(self, source: str, reason: str) -> None:
        self._m["rljob_executor_sample_failures_total"].labels(*self.labels, source, reason).inc()

    def shard_served(self) -> None:
        self._m["rljob_executor_shards_served_total"].labels(*self.labels).inc()

    def batch_delivered(self, lags: Sequence[int], rewards: Sequence[float], seconds: float | None) -> None:
        """A batch was frozen for the trainers: its samples' lags and rewards, how long it took."""
        hist = self._m["rljob_executor_batch_staleness_versions"].labels(*self.labels)
        for lag in lags:
            hist.observe(lag)
        self._m["rljob_executor_last_batch_staleness_versions"].labels(*self.labels).set(max(lags, default=0))
        if rewards:
            self._m["rljob_executor_last_batch_reward_mean"].labels(*self.labels).set(
                sum(rewards) / len(rewards)
            )
        if seconds and seconds > 0:
            self._m["rljob_executor_samples_per_second"].labels(*self.labels).set(len(lags) / seconds)

    def evaluated(self, fleet: str, reward_mean: float, pass_at_1: float) -> None:
        self._m["rljob_executor_eval_reward_mean"].labels(*self.labels, fleet).set(reward_mean)
        self._m["rljob_executor_eval_pass_at_1"].labels(*self.labels, fleet).set(pass_at_1)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
