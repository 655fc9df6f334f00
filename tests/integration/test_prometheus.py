"""A real Prometheus (built from its Go module) scrapes a real RL loop on loopback, and what a
user would look at is checked through its HTTP query API.

One module-scoped run feeds every test: the operator against the test cluster with two jobs
of stand-in engines ("heal": one engine is killed; "crash": one of its two cells crash-loops with a
restart budget of 0), one weight-update window through the controller API, and a local-mode
run (`rljob run examples/tiny-cpu.yaml`: real vLLM CPU engine, real executor and trainer)
whose executor (`data_url`/metrics) and trainer (`--metrics-port`) are scraped too. The
shipped alert rules are loaded unchanged; scrape and evaluation run every second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.fixtures.prometheus import promtool, scrape_config
from tests.integration.operator_harness import (
    PID_ANNOTATION,
    REPO,
    Kube,
    OperatorProcess,
    call,
    control_rbac,
    free_port,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

FILES = REPO / "helm" / "rljob-operator" / "files"
GRAFANA_VARS = {"$namespace": ".*", "$job": ".*", "$__rate_interval": "1m"}


class Loop:
    def __init__(self, kube: Kube, op: OperatorProcess, endpoints: list[str]) -> None:
        self.kube, self.op = kube, op
        self.endpoints = endpoints  # every /metrics URL Prometheus scrapes


def _start_local_run(out: Path, metrics_port: int) -> subprocess.Popen[bytes]:
    log = (out.parent / "rljob-run.log").open("wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rljob_cli.main",
            "run",
            "examples/tiny-cpu.yaml",
            "--out",
            str(out),
            "--steps",
            "60",  # outlives the tests below; stopped with SIGINT at the end
            "--metrics-port",
            str(metrics_port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def loop(cluster: Any, prometheus_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    install_crd(cluster)
    ns = cluster.create_namespace(f"t-prometheus-{uuid.uuid4().hex[:6]}")
    tmp = tmp_path_factory.mktemp("prometheus-loop")
    kube = Kube(cluster, ns)
    op = OperatorProcess(cluster, ns, tmp)
    run: subprocess.Popen[bytes] | None = None
    try:
        # A killed engine of "heal" waits 30 s before it is recreated: long enough to be scraped Unhealthy.
        kube.apply(make_rljob("heal", replicas=2, max_restarts=1, backoff=30, max_backoff=30))
        kube.apply(make_rljob("crash", replicas=2, crash_cells="1", max_restarts=0))
        trainer, _ = control_rbac(kube, "heal")
        trainer_port = free_port()
        run = proc = _start_local_run(tmp / "run", trainer_port)
        ready_file = tmp / "run" / "executor-ready.json"
        ready = wait_for(
            lambda: json.loads(ready_file.read_text()) if ready_file.exists() else proc.poll() is not None,
            600,
            interval=1,
            what="the local run's executor ready",
        )
        assert isinstance(ready, dict), (
            f"rljob run exited with {proc.returncode} before its executor was ready:\n"
            + (tmp / "rljob-run.log").read_text(errors="replace")[-3000:]
        )
        executor = urlsplit(ready["data_url"]).netloc
        prometheus_server.reload(
            scrape_config(
                {
                    "rljob-operator": [f"127.0.0.1:{op.metrics_port}"],
                    "rljob-executor": [executor],
                    "rljob-trainer": [f"127.0.0.1:{trainer_port}"],
                },
                [str(FILES / "alerts.yaml")],
            )
        )
        wait_for(lambda: kube.status("heal").get("ready") == "2/2", 120, what="heal 2/2 serving")
        wait_for(
            lambda: prometheus_server.query('rljob_cells{job="heal",state="Serving"} == 2'),
            60,
            what="heal scraped with 2 serving cells",
        )
        # One weight-update window while scraped: its duration and outcome are series.
        code, window, _ = call(op.api, ns, "heal", "start_update_weights", {"holder": "trainer-0"}, trainer)
        assert code == 200, window
        code, body, _ = call(
            op.api,
            ns,
            "heal",
            "end_update_weights",
            {"snapshot": window["snapshot"], "weightVersion": "2"},
            trainer,
        )
        assert code == 200, body
        yield Loop(
            kube,
            op,
            [
                f"http://{addr}/metrics"
                for addr in (f"127.0.0.1:{op.metrics_port}", executor, f"127.0.0.1:{trainer_port}")
            ],
        )
    finally:
        if run is not None and run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)  # rljob run stops its engines, executor and Ray on SIGINT
            try:
                run.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(30)
        op.stop()
        release_rljobs(cluster, ns)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _one(prom: Any, expr: str) -> dict[str, Any]:
    result = prom.query(expr)
    assert len(result) == 1, (expr, result)
    return result[0]


def test_operator_series_carry_the_jobs_namespace_and_name(loop: Loop, prometheus_server: Any) -> None:
    ns = loop.kube.ns
    serving = _one(prometheus_server, f'rljob_cells{{namespace="{ns}",job="heal",state="Serving"}}')
    assert serving["metric"]["namespace"] == ns and serving["metric"]["job"] == "heal"  # not the scrape job's
    assert (
        _one(prometheus_server, f'rljob_job_phase{{namespace="{ns}",job="heal",phase="Running"}}')["value"][1]
        == "1"
    )
    # The window just closed: the next scrapes show its version and its outcome.
    wait_for(
        lambda: prometheus_server.query(f'rljob_weight_version{{namespace="{ns}",job="heal"}} == 2'),
        30,
        what="weight version 2 scraped",
    )
    done = wait_for(
        lambda: prometheus_server.query(
            f'rljob_weight_update_windows_total{{namespace="{ns}",job="heal"}} == 1'
        ),
        30,
        what="one window counted",
    )
    assert [d["metric"]["outcome"] for d in done] == ["completed"]
    cells = {
        r["metric"]["cell"]
        for r in prometheus_server.query(f'rljob_cell_restarts_remaining{{namespace="{ns}",job="heal"}}')
    }
    assert cells == {"heal-cell-0", "heal-cell-1"}


def test_a_killed_engine_shows_up_as_an_unhealthy_cell(loop: Loop, prometheus_server: Any) -> None:
    kube = loop.kube
    victim = next(
        p for p in kube.engine_pods("heal") if p["metadata"]["labels"]["rljob.io/cell-index"] == "1"
    )
    pid = int(
        wait_for(
            lambda: kube.get("pod", victim["metadata"]["name"])["metadata"]["annotations"].get(
                PID_ANNOTATION
            ),
            30,
            what="pid annotation",
        )
    )
    os.kill(pid, signal.SIGKILL)
    expr = f'rljob_cells{{namespace="{kube.ns}",job="heal",state="Unhealthy"}} == 1'
    wait_for(lambda: prometheus_server.query(expr), 60, what=expr)


def test_the_exhausted_restart_budget_fires_its_alert(loop: Loop, prometheus_server: Any) -> None:
    ns = loop.kube.ns

    def fired() -> list[dict[str, Any]]:
        return [
            a for a in prometheus_server.firing() if a["labels"]["alertname"] == "RLJobRestartBudgetExhausted"
        ]

    failed = f'rljob_cells{{namespace="{ns}",job="crash",state="Failed"}} == 1'
    wait_for(lambda: prometheus_server.query(failed), 120, what=failed)
    try:
        alerts = wait_for(fired, 60, what="RLJobRestartBudgetExhausted firing")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; rules: {prometheus_server.api('rules')}") from exc
    assert [(a["labels"]["namespace"], a["labels"]["job"], a["labels"]["severity"]) for a in alerts] == [
        (ns, "crash", "critical")
    ]
    assert (
        _one(
            prometheus_server,
            f'rljob_cell_restarts_remaining{{namespace="{ns}",job="crash",cell="crash-cell-1"}}',
        )["value"][1]
        == "0"
    )


def test_executor_and_trainer_series_carry_the_local_jobs_labels(loop: Loop, prometheus_server: Any) -> None:
    generated = wait_for(
        lambda: prometheus_server.query("rljob_executor_samples_generated_total > 0"),
        600,
        interval=1,
        what="the executor generated samples",
    )
    assert {(r["metric"]["namespace"], r["metric"]["job"]) for r in generated} == {("local", "tiny-cpu")}
    steps = wait_for(
        lambda: prometheus_server.query('rljob_trainer_step{job="tiny-cpu"} >= 2'),
        600,
        interval=1,
        what="two trainer steps",
    )
    assert steps[0]["metric"]["rank"] == "0"


def test_every_dashboard_panel_query_returns_series(loop: Loop, prometheus_server: Any) -> None:
    dashboard = json.loads((FILES / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    empty: list[str] = []
    for expr in exprs:
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        try:
            wait_for(lambda e=expr: prometheus_server.query(e), 300, interval=1, what=expr)
        except AssertionError:
            empty.append(expr)
    assert not empty, f"panels without series: {empty}"
    # The closing note's example: the weight version each job's engines serve, as Prometheus answers it.
    answer = {
        r["metric"]["job"]: r["value"][1]
        for r in prometheus_server.query("max by (job) (rljob_weight_version)")
    }
    print(f"max by (job) (rljob_weight_version) -> {answer}")
    assert answer["heal"] == "2"


def test_promtool_check_metrics_passes_on_every_live_endpoint(loop: Loop, prometheus_tools: Path) -> None:
    for url in loop.endpoints:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read()
        assert b"rljob_" in text, url
        res = promtool(prometheus_tools, "check", "metrics", stdin=text)
        assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), (url, res.stdout + res.stderr)


def test_the_operators_log_replays_the_jobs_history_with_rljob_audit(loop: Loop) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "rljob_cli.main", "audit", "heal", str(loop.op.log_path), "-n", loop.kube.ns],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert any("heal-cell-1" in ln and "cell_transition" in ln and 'to="Unhealthy"' in ln for ln in lines), (
        lines[-20:]
    )
    assert any("weights_updated" in ln and '"2"' in ln for ln in lines)
    assert not any("crash-cell" in ln for ln in lines)  # another job's records are not shown
