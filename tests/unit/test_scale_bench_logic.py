"""The pure parts of bench/scale_bench.py: reading kube-apiserver's /metrics and audit log."""

from __future__ import annotations

import json
import math

from tests.integration.test_scale_bench import load_bench

METRICS = """# HELP apiserver_request_total Counter of apiserver requests
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 7
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 16
apiserver_request_total{code="200",component="apiserver",dry_run="",group="rljob.io",resource="rljobs",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 9
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="0.1"} 10
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="1"} 16
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="+Inf"} 16
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1",le="+Inf"} 7
"""


def test_metrics_are_split_by_verb_and_writes_by_resource_and_background() -> None:
    b = load_bench()
    m = b.parse_metrics(METRICS)
    assert b.by_verb(m) == {"LIST": 7, "PATCH": 4, "POST": 16, "PUT": 9}
    assert b.writes_by_resource(m) == {"PATCH rljobs/status": 4, "POST pods": 16, "PUT leases": 9}
    assert b.foreground_writes(m) == 20  # Leases are background (and the operator's own Lease)
    assert dict(m.mutating_buckets) == {0.1: 10, 1.0: 16, math.inf: 16}  # LIST is not mutating
    assert b.by_verb(m.minus(b.parse_metrics(METRICS))) == {}


def test_histogram_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    b = load_bench()
    buckets = {0.1: 10.0, 1.0: 16.0, math.inf: 16.0}
    assert math.isclose(b.histogram_quantile(0.5, buckets), 0.08)  # rank 8 of the first 10
    assert math.isclose(b.histogram_quantile(0.99, buckets), 0.1 + 0.9 * (15.84 - 10) / 6)
    assert b.histogram_quantile(0.99, {math.inf: 0.0}) is None


def test_audit_writes_count_one_client_in_the_window() -> None:
    b = load_bench()

    def ev(
        agent: str, verb: str, resource: str, at: str, sub: str | None = None, stage: str = "ResponseComplete"
    ) -> str:
        ref = {"resource": resource, **({"subresource": sub} if sub else {})}
        return json.dumps({"stage": stage, "userAgent": agent, "verb": verb, "objectRef": ref,
                           "requestReceivedTimestamp": at})  # fmt: skip

    lines = [
        ev("rljob-operator/a", "patch", "rljobs", "2026-12-01T10:00:01.5Z", "status"),
        ev(
            "rljob-operator/a", "patch", "rljobs", "2026-12-01T10:00:01.5Z", "status", stage="ResponseStarted"
        ),
        ev("rljob-operator/a", "update", "leases", "2026-12-01T10:00:02Z"),
        ev("kopf/1.38", "patch", "rljobs", "2026-12-01T10:00:03Z"),
        ev("kube-controller-manager/v1.36.3", "update", "leases", "2026-12-01T10:00:02Z"),
        ev("rljob-operator/a", "create", "pods", "2026-12-01T10:00:09Z"),  # after the window
    ]
    since = 1_796_119_201.0  # 2026-12-01T10:00:01Z
    got = b.audit_writes(iter(lines), since, since + 5, ("rljob-operator/", "kopf/"))
    assert got == {"patch rljobs": 1, "patch rljobs/status": 1, "update leases": 1}


def test_scale_nodes_get_loopback_pod_cidrs_apart_from_every_worktrees_nodes() -> None:
    b = load_bench()
    nodes = json.loads(b.scale_nodes_yaml(255, 2))["items"]
    assert [n["spec"]["podCIDR"] for n in nodes] == ["127.71.255.0/24", "127.72.0.0/24"]
    assert nodes[0]["status"]["allocatable"]["nvidia.com/gpu"] == "64"


def test_the_operators_pool_waits_are_read_by_queue_from_its_own_metrics() -> None:
    """The operator's exposition, as its /metrics serves it, read back by the benchmark."""
    from rljob_operator.kube.api_pool import OUTSIDE_PASSES, RESYNC, WORK
    from rljob_operator.metrics import Metrics

    metrics = Metrics()
    for _ in range(9):
        metrics.observe_queue_wait((RESYNC, 1.0), 7.0)
    metrics.observe_queue_wait((RESYNC, 2.0), 0.003)
    metrics.observe_queue_wait((WORK, 3.0), 0.002)
    metrics.observe_queue_wait(OUTSIDE_PASSES, 0.0005)
    waits = load_bench().pool_waits(metrics.exposition().decode())
    assert set(waits) == {"outside", "work", "resync"}
    assert waits["resync"]["calls"] == 10 and waits["work"]["calls"] == 1
    assert 5.0 < waits["resync"]["p50"] <= 10.0 and waits["work"]["p99"] <= 0.005


def test_the_operators_passes_are_summed_over_its_jobs_from_its_own_metrics() -> None:
    from rljob_operator.metrics import Metrics

    metrics = Metrics()
    metrics.reconciles.labels("ns", "a").inc(3)
    metrics.reconciles.labels("ns", "b").inc(4)
    metrics.reconcile_errors.labels("ns", "a", "pass").inc(5)  # another metric: not counted
    assert load_bench().metric_total(metrics.exposition().decode(), "rljob_reconcile_total") == 7


def test_a_pods_milestones_are_read_from_its_node_phase_ready_condition_and_serving_label() -> None:
    b = load_bench()
    made = {"metadata": {"name": "j-cell-0-g0-0", "labels": {"rljob.io/serving": "false"}}, "spec": {}}
    assert b.pod_milestones(made) == []
    live = {
        "metadata": {"name": "j-cell-0-g0-0", "labels": {"rljob.io/serving": "true"}},
        "spec": {"nodeName": "scale-0"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert b.pod_milestones(live) == ["bound", "running", "ready", "serving"]
    not_ready = {**live, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}
    assert b.pod_milestones(not_ready) == ["bound", "running", "serving"]


def test_milestone_seconds_counts_only_the_named_pods_that_reached_it() -> None:
    b = load_bench()
    at = {f"p{i}": 100.0 + i for i in range(10)} | {"other": 500.0}
    got = b.milestone_seconds(at, 100.0, [f"p{i}" for i in range(12)])
    assert got == {"count": 10, "p50": 4.5, "p90": 8.0, "last": 9.0}
    assert b.milestone_seconds(at, 100.0, ["q"]) == {"count": 0, "p50": None, "p90": None, "last": None}


def _node(name: str, uid: str, ready: str = "True") -> dict[str, object]:
    return {
        "metadata": {"name": name, "uid": uid},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def _lease(name: str, owner_uid: str, holder: str = "kwok") -> dict[str, object]:
    return {
        "metadata": {"name": name, "ownerReferences": [{"kind": "Node", "name": name, "uid": owner_uid}]},
        "spec": {"holderIdentity": holder},
    }


def test_a_node_counts_as_managed_only_when_kwok_holds_a_lease_of_this_node_not_of_its_namesake() -> None:
    b = load_bench()
    nodes = {
        "items": [_node("scale-0", "new-0"), _node("scale-1", "new-1"), _node("scale-2", "new-2", "False")]
    }
    leases = {
        "items": [
            _lease("scale-0", "new-0"),
            _lease("scale-1", "old-1"),  # the deleted node of the same name: not yet collected
            _lease("scale-2", "new-2"),  # held, but the node is not Ready
        ]
    }
    assert b.managed_nodes(nodes, leases) == 1
    leases["items"][1] = _lease("scale-1", "new-1", holder="")
    assert b.managed_nodes(nodes, leases) == 1  # no holder yet
    leases["items"][1] = _lease("scale-1", "new-1")
    assert b.managed_nodes(nodes, leases) == 2
