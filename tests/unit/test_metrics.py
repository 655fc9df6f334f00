"""The metrics: per-job gauges computed from a status, every declared family exported, window
outcomes counted once per window, and the alert rules and dashboard naming only metrics that
exist (a renamed metric would leave them silently empty)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import yaml
from rljob_client.trainer import metrics as trainer_metrics
from rljob_operator import metrics as operator_metrics
from rljob_operator.job_gauges import JobSnapshot, job_samples
from rljob_operator.metrics import Metrics
from rollout_executor import metrics as executor_metrics

from controller_runtime.clock import FakeClock, parse_iso
from controller_runtime.events import WINDOW_OUTCOMES, ControllerEvent, Reason

FILES = Path(__file__).resolve().parents[2] / "helm" / "rljob-operator" / "files"
ALL_SPECS = {s.name: s for m in (operator_metrics, executor_metrics, trainer_metrics) for s in m.SPECS}
NOW = parse_iso("2026-12-01T10:00:30Z")
STATUS = {
    "phase": "Running",
    "weightVersion": "7",
    "rolloutId": 6,
    "engines": [
        {"name": "j-cell-0", "state": "Serving", "restarts": 0, "lastProbeTime": "2026-12-01T10:00:28Z"},
        {"name": "j-cell-1", "state": "Failed", "restarts": 2},
    ],
    "lock": {"holder": "trainer-0", "since": "2026-12-01T09:59:00Z", "expires": "2026-12-01T10:00:00Z"},
}


def test_job_gauges_follow_the_status_and_the_clock() -> None:
    samples = {
        (name, labels): value for name, labels, value in job_samples(JobSnapshot(STATUS, max_restarts=2), NOW)
    }
    assert samples[("rljob_job_phase", ("Running",))] == 1 and samples[("rljob_job_phase", ("Pending",))] == 0
    assert samples[("rljob_cells", ("Serving",))] == 1 and samples[("rljob_cells", ("Failed",))] == 1
    assert samples[("rljob_cells", ("Unhealthy",))] == 0  # every state is exported, 0 included
    assert samples[("rljob_weight_version", ())] == 7 and samples[("rljob_rollout_id", ())] == 6
    assert samples[("rljob_cell_restarts_remaining", ("j-cell-0",))] == 2
    assert samples[("rljob_cell_restarts_remaining", ("j-cell-1",))] == 0
    assert samples[("rljob_cell_last_probe_age_seconds", ("j-cell-0",))] == 2
    assert ("rljob_cell_last_probe_age_seconds", ("j-cell-1",)) not in samples  # never probed
    assert samples[("rljob_cell_consecutive_probe_failures", ("j-cell-0",))] == 0
    assert (
        samples[("rljob_lock_held_seconds", ())] == 90 and samples[("rljob_lock_overdue_seconds", ())] == 30
    )


def test_no_lock_and_a_non_numeric_version() -> None:
    samples = {
        (n, lb): v for n, lb, v in job_samples(JobSnapshot({"weightVersion": "init", "engines": []}), NOW)
    }
    assert samples[("rljob_lock_held_seconds", ())] == 0 and samples[("rljob_lock_overdue_seconds", ())] == 0
    assert ("rljob_weight_version", ()) not in samples
    assert not any(n == "rljob_cell_restarts_remaining" for n, _ in samples)  # budget unknown yet


def _families(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def test_a_failed_job_exports_its_failure_reason_after_its_cells_are_gone() -> None:
    status = {
        "phase": "Failed",
        "engines": [],
        "conditions": [{"type": "Failed", "status": "True", "reason": "RestartBudgetExhausted"}],
    }
    samples = {(n, lb): v for n, lb, v in job_samples(JobSnapshot(status), NOW)}
    assert samples[("rljob_job_failed", ("RestartBudgetExhausted",))] == 1.0
    assert samples[("rljob_cells", ("Failed",))] == 0.0
    running = {n for n, _, _ in job_samples(JobSnapshot({"phase": "Running", "engines": []}), NOW)}
    assert "rljob_job_failed" not in running


def test_operator_exports_every_declared_family_with_its_type() -> None:
    m = Metrics(FakeClock(start=NOW))
    m.set_max_restarts("ns", "j", 2)
    m.observe_status("ns", "j", STATUS)
    text = m.exposition().decode()
    assert _families(text) == {s.name: s.type for s in operator_metrics.SPECS}
    assert 'rljob_cell_last_probe_age_seconds{cell="j-cell-0",job="j",namespace="ns"} 2.0' in text
    m.forget_job("ns", "j")
    assert "j-cell-0" not in m.exposition().decode()


def test_the_asyncio_task_gauge_counts_the_tasks_of_the_loop_that_serves_the_scrape() -> None:
    """Counted when scraped, on the loop that serves /metrics: a task left running shows at once."""

    async def scrape_with(extra: int) -> float:
        release = asyncio.Event()
        tasks = [asyncio.create_task(release.wait()) for _ in range(extra)]
        await asyncio.sleep(0)
        text = Metrics().exposition().decode()
        release.set()
        await asyncio.gather(*tasks)
        return float(re.search(r"^rljob_operator_asyncio_tasks (\S+)$", text, re.M)[1])  # type: ignore[index]

    assert asyncio.run(scrape_with(5)) - asyncio.run(scrape_with(0)) == 5
    assert "rljob_operator_asyncio_tasks 0.0" in Metrics().exposition().decode()  # no loop: 0


def test_the_task_census_names_the_coroutine_each_task_runs() -> None:
    """Which code holds the tasks: three parked on one coroutine show as three of it, by module
    and qualname, and they sum to the total gauge."""

    async def parked(release: asyncio.Event) -> None:
        await release.wait()

    async def scrape() -> str:
        release = asyncio.Event()
        tasks = [asyncio.create_task(parked(release)) for _ in range(3)]
        await asyncio.sleep(0)
        text = Metrics().exposition().decode()
        release.set()
        await asyncio.gather(*tasks)
        return text

    text = asyncio.run(scrape())
    name = f"{__name__}.test_the_task_census_names_the_coroutine_each_task_runs.<locals>.parked"
    census = {
        m[1]: float(m[2])
        for m in re.finditer(
            r'^rljob_operator_asyncio_tasks_by_coroutine\{coroutine="([^"]+)"\} (\S+)$', text, re.M
        )
    }
    assert census[name] == 3
    total = float(re.search(r"^rljob_operator_asyncio_tasks (\S+)$", text, re.M)[1])  # type: ignore[index]
    assert sum(census.values()) == total


def test_a_forgotten_job_leaves_no_series_behind() -> None:
    """A deleted job's counters and histograms go with it: under churn (bench/soak.py) every
    job ever reconciled otherwise kept its series, and the operator's memory grew with them."""
    m = Metrics()
    for job in ("gone", "kept"):
        m.reconciles.labels("ns", job).inc()
        m.reconcile_seconds.labels("ns", job).observe(0.1)
        m.probe_seconds.labels("ns", job).observe(0.01)
        m.restarts.labels("ns", job).inc()
        m.reconcile_errors.labels("ns", job, "engines").inc()
        m.count_event("ns", job, ControllerEvent(Reason.WeightsUpdated, "v2", outcome="completed"))
        m.observe_status("ns", job, STATUS)
    m.api_calls.labels("start_update_weights", "200").inc()
    m.forget_job("ns", "gone")
    text = m.exposition().decode()
    assert 'job="gone"' not in text
    assert 'rljob_reconcile_total{job="kept",namespace="ns"} 1.0' in text
    assert 'rljob_controller_api_calls_total{code="200",verb="start_update_weights"} 1.0' in text


def test_each_closed_window_is_counted_once_by_its_outcome() -> None:
    m = Metrics()
    events = [
        ControllerEvent(Reason.LockExpired, "expired"),
        ControllerEvent(Reason.WindowAborted, "x", outcome="expired"),
        ControllerEvent(Reason.WeightsUpdated, "v2", outcome="completed"),
        ControllerEvent(Reason.CellServing, "x"),
    ]
    for e in events:
        m.count_event("ns", "j", e)
    text = m.exposition().decode()
    counted = dict(re.findall(r'^rljob_weight_update_windows_total\{.*outcome="(\w+)"\} (\S+)$', text, re.M))
    assert counted == {"expired": "1.0", "completed": "1.0"}
    assert set(counted) <= set(WINDOW_OUTCOMES)


def test_executor_and_trainer_export_every_declared_family() -> None:
    ex = executor_metrics.ExecutorMetrics("ns", "j", 1, lambda: (3, 2))
    ex.sample_scored()
    ex.batch_delivered([0, 1, 2], [0.5, 1.0, 0.0], 2.0)
    ex.evaluated("policy", 0.4, 0.25)
    text = ex.exposition().decode()
    assert _families(text) == {s.name: s.type for s in executor_metrics.SPECS}
    assert 'rljob_executor_last_batch_staleness_versions{job="j",namespace="ns"} 2.0' in text
    assert 'rljob_executor_samples_per_second{job="j",namespace="ns"} 1.5' in text
    assert 'rljob_executor_requests_retried_total{job="j",namespace="ns"} 2.0' in text
    tr = trainer_metrics.TrainerMetrics("ns", "j", 0)
    tr.step_done(4, 1.0, 2.0, 0.5, 0.3)
    text = tr.exposition().decode()
    assert _families(text) == {s.name: s.type for s in trainer_metrics.SPECS}
    assert 'rljob_trainer_step{job="j",namespace="ns",rank="0"} 5.0' in text


def _names_in(expr: str) -> set[str]:
    names = set()
    for n in re.findall(r"\brljob_[a-z0-9_]+", expr):
        base = re.sub(r"_(bucket|sum|count)$", "", n)
        names.add(base if base in ALL_SPECS and ALL_SPECS[base].type == "histogram" else n)
    return names


def _alert_exprs() -> dict[str, str]:
    rules = yaml.safe_load((FILES / "alerts.yaml").read_text())
    return {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}


def _panel_exprs() -> list[str]:
    dash = json.loads((FILES / "dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def test_alerts_and_dashboard_use_only_exported_metrics() -> None:
    used = set().union(*(_names_in(e) for e in [*_alert_exprs().values(), *_panel_exprs()]))
    assert used - set(ALL_SPECS) == set()
    assert len(used) > 15  # the regex found the names at all


def test_job_labels_are_never_pod_level() -> None:
    for spec in ALL_SPECS.values():
        assert "pod" not in spec.labels, spec.name
        if spec.type == "counter":
            assert spec.name.endswith("_total"), spec.name
