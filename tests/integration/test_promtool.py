"""promtool (built from the Prometheus module, tests/cluster/build prometheus) on what we ship:
`check metrics` on every /metrics output (operator, executor, trainer), `check rules` on the
alert rules, and `test rules` on their unit tests, which must cover every alert."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rljob_client.trainer.metrics import TrainerMetrics
from rljob_operator.metrics import Metrics
from rollout_executor.metrics import ExecutorMetrics

from controller_runtime.clock import FakeClock, parse_iso
from tests.fixtures.prometheus import promtool

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "helm" / "rljob-operator" / "files" / "alerts.yaml"
RULE_TESTS = Path(__file__).parent / "rules" / "alerts_test.yaml"


def operator_output() -> bytes:
    m = Metrics(FakeClock(start=parse_iso("2026-12-01T10:00:30Z")))
    m.set_max_restarts("team-a", "demo", 3)
    m.observe_status(
        "team-a",
        "demo",
        {
            "phase": "Running",
            "weightVersion": "4",
            "rolloutId": 3,
            "engines": [
                {
                    "name": "demo-cell-0",
                    "state": "Serving",
                    "restarts": 1,
                    "lastProbeTime": "2026-12-01T10:00:29Z",
                }
            ],
            "lock": {"holder": "t", "since": "2026-12-01T10:00:00Z", "expires": "2026-12-01T10:05:00Z"},
        },
    )
    m.leader.set(1)
    m.reconciles.labels("team-a", "demo").inc()
    m.reconcile_errors.labels("team-a", "demo", "engines").inc()
    m.reconcile_seconds.labels("team-a", "demo").observe(0.02)
    m.probe_seconds.labels("team-a", "demo").observe(0.003)
    m.weight_update_seconds.labels("team-a", "demo").observe(1.5)
    m.windows.labels("team-a", "demo", "completed").inc()
    m.restarts.labels("team-a", "demo").inc()
    m.api_calls.labels("cells", "200").inc()
    m.api_seconds.labels("cells").observe(0.01)
    return m.exposition()


def executor_output() -> bytes:
    ex = ExecutorMetrics("team-a", "demo", 1, lambda: (4, 1))
    ex.sample_scored()
    ex.batch_delivered([0, 1], [0.25, 0.75], 0.5)
    ex.evaluated("policy", 0.5, 0.5)
    return ex.exposition()


def trainer_output() -> bytes:
    tr = TrainerMetrics("team-a", "demo", 0)
    tr.step_done(0, 1.0, 0.5, 0.25, 0.4)
    return tr.exposition()


@pytest.mark.parametrize(
    "output", [operator_output, executor_output, trainer_output], ids=lambda f: f.__name__
)
def test_promtool_check_metrics_passes_on_every_metrics_output(prometheus_tools: Path, output) -> None:
    text = output()
    assert b"rljob_" in text
    res = promtool(prometheus_tools, "check", "metrics", stdin=text)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


def test_promtool_check_metrics_does_flag_a_badly_named_counter(prometheus_tools: Path) -> None:
    """The check above can fail: a counter without `_total` is reported."""
    bad = b"# HELP rljob_bad Bad.\n# TYPE rljob_bad counter\nrljob_bad 1\n"
    res = promtool(prometheus_tools, "check", "metrics", stdin=bad)
    assert res.returncode != 0 and "_total" in res.stdout + res.stderr


def test_alert_rules_are_valid(prometheus_tools: Path) -> None:
    res = promtool(prometheus_tools, "check", "rules", str(ALERTS))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 6 rules found" in res.stdout


def test_every_alert_has_a_promtool_unit_test_and_they_pass(prometheus_tools: Path) -> None:
    alerts = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t["alert_rule_test"]}
    assert tested == alerts
    firing = {case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]}
    assert firing == alerts  # each one is seen firing, not only quiet
    res = promtool(prometheus_tools, "test", "rules", str(RULE_TESTS), cwd=RULE_TESTS.parent)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout
