"""The reference trainer's Prometheus metrics: where a step's time goes.

A step waits for its rollout, trains, then syncs the weights to the engines; which of the
three dominates decides what to scale (engines, trainer GPUs, the transfer), so each is its
own series of one histogram. Served with `--metrics-port` (prometheus_client's own HTTP
server thread), one endpoint per trainer rank.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from controller_runtime.metric_specs import JOB, MetricSpec, build_metric

PHASES = ("rollout_wait", "train", "sync")
SPECS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "rljob_trainer_step_phase_duration_seconds",
        "histogram",
        (*JOB, "rank", "phase"),
        "Seconds of one training step by phase: rollout_wait, train, sync.",
        (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    ),
    MetricSpec("rljob_trainer_step", "gauge", (*JOB, "rank"), "Training steps completed."),
    MetricSpec(
        "rljob_trainer_batch_reward_mean",
        "gauge",
        (*JOB, "rank"),
        "Mean reward of the batch the last step trained on.",
    ),
)


class TrainerMetrics:
    def __init__(self, namespace: str, job: str, rank: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = (namespace, job, str(rank))
        self._m: dict[str, Any] = {s.name: build_metric(s, self.registry) for s in SPECS}

    def step_done(
        self, step: int, rollout_wait: float, train: float, sync: float, reward_mean: float
    ) -> None:
        hist = self._m["rljob_trainer_step_phase_duration_seconds"]
        for phase, seconds in zip(PHASES, (rollout_wait, train, sync), strict=True):
            hist.labels(*self.labels, phase).observe(max(0.0, seconds))
        self._m["rljob_trainer_step"].labels(*self.labels).set(step + 1)
        self._m["rljob_trainer_batch_reward_mean"].labels(*self.labels).set(reward_mean)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, host, registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
