"""Kubernetes API faults between the operator and the kube-apiserver (tests/reliability/apiproxy.py).

Each test runs the real operator with its kubeconfig pointed at the fault proxy, a job of
stand-in engine cells, and says which faults it injects. Expectation for every fault: the job
converges to its spec (all cells serving, one pod per slot), the operator never crash-loops
(the process lives; a restart is only the one the test makes), and the history invariants of
tests/reliability/history.py hold (checked from the audit log after each test).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rljob_client.controller_client import InferenceControllerClient
from rljob_operator.relist import NUDGE_ANNOTATION

from tests.cluster.apiserver import restart_apiserver
from tests.integration.operator_harness import (
    Kube,
    OperatorProcess,
    control_rbac,
    engine_states,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)
from tests.reliability import history
from tests.reliability.apiproxy import ApiProxy, Fault, Upstream

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]


@pytest.fixture
def proxy(cluster) -> Iterator[ApiProxy]:
    install_crd(cluster)
    p = ApiProxy(Upstream.from_kubeconfig(Path(cluster.kubeconfig))).start()
    yield p
    p.stop()


@pytest.fixture
def operators(cluster, namespace, tmp_path, proxy) -> Iterator[Any]:
    started: list[OperatorProcess] = []
    kubeconfig = proxy.kubeconfig(tmp_path / "proxy.kubeconfig")

    def start(*extra: str, identity: str = "op-a") -> OperatorProcess:
        op = OperatorProcess(
            cluster, namespace, tmp_path, identity=identity, kubeconfig=kubeconfig, extra_args=extra
        )
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()
    release_rljobs(cluster, namespace)


def converged(kube: Kube, job: str, cells: int, pods_per_cell: int = 1) -> bool:
    status = kube.status(job)
    live = [p for p in kube.engine_pods(job) if not p["metadata"].get("deletionTimestamp")]
    return status.get("ready") == f"{cells}/{cells}" and len(live) == cells * pods_per_cell


def two_pod_cell_job(name: str) -> dict[str, Any]:
    job = make_rljob(name, replicas=1)
    inf = job["spec"]["inference"]
    # two 1-GPU pods per cell: every case's job stays, and the simulated nodes keep room for all
    inf.update(engine="sglang", gpusPerEngine=2, gpusPerNode=1)
    inf.pop("tensorParallelSize", None)
    return job


def test_throttling_errors_resets_and_a_slow_api_server_converge(cluster, namespace, proxy, operators):
    kube = Kube(cluster, namespace)
    faults = [
        proxy.add(Fault("status", "POST", "pods", status=429, retry_after=1, times=3)),
        proxy.add(Fault("status", "PATCH", "status", status=503, times=3)),
        proxy.add(Fault("status", "PATCH", "services", status=500, times=2)),
        proxy.add(Fault("reset", "PATCH", "deployments", times=2)),
        proxy.add(Fault("reset", "GET", "pods", watch=False, times=2)),
    ]
    # The chart's Lease timing (15 s / 10 s / 2 s): a second per request makes every Lease round
    # (read + write) take two, longer than the retry period (the old bound on a round).
    op = operators("--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")
    kube.apply(make_rljob("noisy", replicas=2))
    wait_for(lambda: converged(kube, "noisy", 2), 180, what="2/2 through 429s, 5xx and resets")
    assert all(f.applied == f.times for f in faults), [(f.action, f.resource, f.applied) for f in faults]

    proxy.clear()
    slow = proxy.add(Fault("delay", seconds=1.0, times=0))  # every request waits a second
    cluster.kubectl(
        "patch",
        "rlj",
        "noisy",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"inference":{"replicas":3}}}',
    )
    wait_for(lambda: converged(kube, "noisy", 3), 240, what="3/3 on a slow API server")
    assert slow.applied > 10
    assert op.proc.poll() is None, "the operator died:\n" + op.log_tail()


def test_operator_killed_after_its_first_writes_converges_once_restarted(
    cluster, namespace, proxy, operators
):
    """SIGKILL right after the k-th write of a kind: inside a two-pod cell's creation (after its
    first pod), after the first and the third status patch, after the first Event (core/v1
    `POST /api/v1/namespaces/<ns>/events`: what kubeapi.create_event and kopf's posting
    write); a new replica finishes."""
    kube = Kube(cluster, namespace)
    cases = [("POST", "pods", 1), ("PATCH", "status", 1), ("PATCH", "status", 3), ("POST", "events", 1)]
    for n, (method, resource, k) in enumerate(cases):
        name = f"crash{n}"
        victim: list[OperatorProcess] = []

        def kill(victim: list[OperatorProcess] = victim) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(victim[0].proc.pid, signal.SIGKILL)

        fault = proxy.add(Fault("after", method, resource, watch=False, skip=k - 1, after=kill))
        victim.append(operators(identity=f"op-{n}a"))
        kube.apply(two_pod_cell_job(name))
        wait_for(
            lambda victim=victim: victim[0].proc.poll() is not None,
            120,
            what=f"the operator killed after {method} {resource} #{k}",
        )
        proxy.faults.remove(fault)
        successor = operators(identity=f"op-{n}b")
        wait_for(lambda name=name: converged(kube, name, 1, pods_per_cell=2), 180,
                 what=f"{name}: the two-pod cell serving after the restart")  # fmt: skip
        successor.stop()


def test_unchanged_children_are_not_read_and_a_deleted_or_edited_child_is_repaired(
    cluster, namespace, proxy, operators
):
    """The children resync read every child of every job each period (~100 GETs/s at rest for
    1,000 jobs, issue 13). Their versions are watched now (`child_versions`): a child that did
    not change is not read; one deleted or edited by someone else is read at the next check and
    applied again. Faults: the job's `-engines` Service deleted, twice; its engine NetworkPolicy's
    labels edited. The proxy counts the operator's reads of children (watches aside)."""
    kube = Kube(cluster, namespace)
    operators("--children-resync", "1")
    kube.apply(make_rljob("calm", replicas=1))
    wait_for(lambda: converged(kube, "calm", 1), 120, what="1/1")
    reads = {r: proxy.add(Fault("delay", "GET", r, watch=False, times=0, seconds=0.0))
             for r in ("services", "networkpolicies")}  # fmt: skip
    for n in (1, 2):
        cluster.kubectl("delete", "service", "calm-engines", "-n", namespace)
        wait_for(lambda: kube.get("service", "calm-engines") is not None, 60, what=f"calm-engines back ({n})")
    policy = "calm-engine-ingress"
    cluster.kubectl("label", "networkpolicy", policy, "-n", namespace, "--overwrite", "rljob.io/role=tampered")
    wait_for(lambda: (kube.get("networkpolicy", policy) or {}).get("metadata", {}).get("labels", {}).get("rljob.io/role")
             == "engine", 60, what="the NetworkPolicy's label restored")  # fmt: skip
    # Checked every second for the whole time: the three Services and two NetworkPolicies read
    # on every check before; now the deleted Service once per deletion, the edited policy once.
    assert (reads["services"].matched, reads["networkpolicies"].matched) == (2, 1)


def test_a_new_jobs_cells_join_serving_without_a_label_write(cluster, namespace, proxy, operators):
    """Each cell head of a new job was created `serving=false` and PATCHed `true` once its engine
    answered: 4,000 pod PATCHes in a ramp of 1,000 jobs (issue 13). The heads are created serving
    now (the `-engines` Service lists them once their readinessProbe passes); the proxy counts the
    operator's pod PATCHes from before the job exists until it serves."""
    kube = Kube(cluster, namespace)
    patches = proxy.add(Fault("delay", "PATCH", "pods", times=0, seconds=0.0))
    operators()
    kube.apply(make_rljob("fresh", replicas=2))
    wait_for(lambda: converged(kube, "fresh", 2), 120, what="2/2")
    heads = {p["metadata"]["name"]: p["metadata"]["labels"].get("rljob.io/serving") for p in kube.engine_pods("fresh")}
    assert heads == {"fresh-cell-0-g0-0": "true", "fresh-cell-1-g0-0": "true"}
    assert patches.matched == 0


def test_a_410_gone_and_a_stalled_watch_are_survived(cluster, namespace, proxy, operators):
    kube = Kube(cluster, namespace)
    gone = proxy.add(Fault("gone", "GET", "rljobs", watch=True, times=1))
    stall = proxy.add(Fault("stall", "GET", "rljobs", watch=True, times=1, seconds=60))
    op = operators("--watch-server-timeout", "4", "--watch-client-timeout", "6")
    wait_for(lambda: stall.applied == 1, 60, what="the operator's RLJob watch stalled")
    kube.apply(make_rljob("quiet", replicas=1))  # created while the watch delivers nothing
    wait_for(
        lambda: converged(kube, "quiet", 1), 120, what="the job handled after the stalled watch was given up"
    )
    assert gone.applied == 1 and op.proc.poll() is None


def pod_watch_count(op: OperatorProcess, family: str, label: str) -> float:
    """One series of the operator's pod watch counters (`events` by type, `restarts` by reason)."""
    key = "type" if family == "events" else "reason"
    pattern = rf'^rljob_operator_pod_watch_{family}_total\{{{key}="{label}"\}} (\S+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, op.metrics(), re.MULTILINE))


def test_the_engine_pod_watch_survives_a_410_and_a_stall(cluster, namespace, proxy, operators):
    """Fault: the operator's own engine pod watch (`list_watch`) is answered `410 Gone` once, then
    with a stream that stalls (headers, then nothing). Expectation: it lists again after the 410,
    gives the stalled stream up at the client timeout and watches again from where it was: the
    pods of a job created during the stall reach the operator as watch events (counted by type),
    and the job converges."""
    kube = Kube(cluster, namespace)
    gone = proxy.add(Fault("gone", "GET", "pods", watch=True, times=1))
    stall = proxy.add(Fault("stall", "GET", "pods", watch=True, times=1, seconds=60))
    op = operators("--watch-server-timeout", "4", "--watch-client-timeout", "6")
    wait_for(lambda: stall.applied == 1, 60, what="the operator's pod watch stalled")
    assert pod_watch_count(op, "restarts", "gone") == 1
    kube.apply(make_rljob("podwatch", replicas=2))  # created while the watch delivers nothing
    wait_for(lambda: converged(kube, "podwatch", 2), 120, what="2/2 after the stalled pod watch")
    wait_for(
        lambda: pod_watch_count(op, "events", "ADDED") >= 2 and pod_watch_count(op, "restarts", "timeout") >= 1,
        60,
        what="the new job's pods delivered by the watch resumed after the stall",
    )
    assert gone.applied == 1 and op.proc.poll() is None


def cell_restarts(kube: Kube, job: str) -> dict[str, int]:
    return {c["name"]: int(c.get("restarts", 0)) for c in kube.status(job).get("engines") or []}


def test_stale_pod_lists_never_recreate_a_serving_cell(cluster, namespace, proxy, operators):
    """Fault: once the job serves, its pod LISTs are answered with the first answer of each
    (recorded when no pod existed yet): a read from a cache behind by minutes.
    Expectation: a stale "no pods" is not taken for dead cells: none is recreated (restarts
    stay 0, no second pod for a slot in the audit log), the weight version is kept, and the
    job is still 2/2 once fresh answers come back. (A steady job reads its pods from the pod
    watch and LISTs them only every --pod-relist seconds; 0 here makes every pass LIST, the
    read this fault is about.)"""
    kube = Kube(cluster, namespace)
    stale = proxy.add(Fault("stale", "GET", "pods", watch=False, skip=10**9, times=0))
    op = operators("--pod-relist=0")
    kube.apply(make_rljob("stale", replicas=2))
    wait_for(lambda: converged(kube, "stale", 2), 120, what="2/2 before the stale reads")
    before = kube.status("stale")
    pods_before = sorted(p["metadata"]["name"] for p in kube.engine_pods("stale"))
    stale.skip, stale.times = stale.matched, 4  # from now on the next reads get the old answers
    wait_for(lambda: stale.applied >= 4, 60, what="four stale pod lists answered")
    wait_for(lambda: converged(kube, "stale", 2), 60, what="2/2 after the stale reads")
    assert cell_restarts(kube, "stale") == {n: 0 for n in cell_restarts(kube, "stale")} != {}
    assert sorted(p["metadata"]["name"] for p in kube.engine_pods("stale")) == pods_before
    assert kube.status("stale").get("weightVersion") == before.get("weightVersion")
    assert op.proc.poll() is None, "the operator died:\n" + op.log_tail()


def live_engine_pods(kube: Kube, job: str) -> list[str]:
    return sorted(
        p["metadata"]["name"] for p in kube.engine_pods(job) if not p["metadata"].get("deletionTimestamp")
    )


def scale(cluster: Any, namespace: str, job: str, replicas: int) -> None:
    """Edit the spec with kubectl, straight to the API server (not through the proxy)."""
    patch = f'{{"spec":{{"inference":{{"replicas":{replicas}}}}}}}'
    cluster.kubectl("patch", "rlj", job, "-n", namespace, "--type=merge", "-p", patch)


def reconciles(op: OperatorProcess, job: str) -> float:
    """The passes `op` made of `job` (its rljob_reconcile_total)."""
    pattern = rf'^rljob_reconcile_total\{{[^}}]*job="{job}"[^}}]*\}} (\S+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, op.metrics(), re.MULTILINE))


def test_a_stale_rljob_list_on_restart_never_undoes_a_newer_spec(cluster, namespace, proxy, operators):
    """Fault: a restarted operator's LIST of RLJobs (kopf lists once, then watches from the
    list's resourceVersion) is answered with the first answer its predecessor got, the job at
    generation 1 (1 replica, no status) while it is at generation 2 (2 replicas) and served
    as such; its RLJob watch is held back 5 s, so that kopf's replay of the newer events
    cannot reach the job before its first pass (as a loaded operator's watch may not).
    Expectation: the old spec is never acted on: no cell is deleted or recreated (the same two
    pods throughout), status.observedGeneration never goes back to 1 (audit log), and the job
    is 2/2 at generation 2 after passes of the new operator."""
    kube = Kube(cluster, namespace)
    kube.apply(make_rljob("relist", replicas=1))
    stale = proxy.add(Fault("stale", "GET", "rljobs", watch=False, skip=10**9, times=0))
    first = operators("--watch-server-timeout", "4", "--watch-client-timeout", "6", identity="op-a")
    wait_for(lambda: converged(kube, "relist", 1), 120, what="1/1 at generation 1")
    scale(cluster, namespace, "relist", 2)
    wait_for(lambda: converged(kube, "relist", 2), 120, what="2/2 at generation 2")
    wait_for(lambda: kube.status("relist").get("observedGeneration") == 2, 30, what="observedGeneration 2")
    pods = live_engine_pods(kube, "relist")
    first.stop()
    stale.skip, stale.times = stale.matched, 1
    held = proxy.add(Fault("delay", "GET", "rljobs", watch=True, seconds=5))
    op = operators("--watch-server-timeout", "4", "--watch-client-timeout", "6", identity="op-b")
    wait_for(lambda: stale.applied == 1 and held.applied == 1, 60, what="the stale RLJob list answered")
    wait_for(lambda: reconciles(op, "relist") >= 3, 60, what="three passes of the restarted operator")
    wait_for(lambda: converged(kube, "relist", 2), 60, what="2/2 after the stale lists")
    assert live_engine_pods(kube, "relist") == pods
    assert kube.status("relist").get("observedGeneration") == 2
    assert cell_restarts(kube, "relist") == {n: 0 for n in pods and cell_restarts(kube, "relist")}
    assert op.proc.poll() is None, "the operator died:\n" + op.log_tail()


def test_an_api_server_restart_is_reconnected_to(cluster, namespace, proxy, operators):
    """Fault: the API server "restarts" (emulated at the proxy: every open connection, watches
    and the Lease's included, is cut, and every request cut for 5 s, within the chart's renew
    deadline of 10 s) while the spec is scaled from 1 to 2. Expectation: the operator lives,
    reconnects, still leads and converges to 2/2, the first cell kept (same pod, restarts 0).
    (An outage past the renew deadline makes it exit on purpose, as client-go's elector does.)"""
    kube = Kube(cluster, namespace)
    op = operators("--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")
    kube.apply(make_rljob("bounce", replicas=1))
    wait_for(lambda: converged(kube, "bounce", 1), 120, what="1/1 before the restart")
    pods = live_engine_pods(kube, "bounce")
    assert proxy.outage(5.0) > 0, "no connection was open to cut"
    scale(cluster, namespace, "bounce", 2)
    wait_for(lambda: converged(kube, "bounce", 2), 120, what="2/2 after the API server came back")
    assert set(pods) <= set(live_engine_pods(kube, "bounce"))
    assert cell_restarts(kube, "bounce") == {"bounce-cell-0": 0, "bounce-cell-1": 0}
    assert op.proc.poll() is None and op.is_leader(), "the operator died or leads no more:\n" + op.log_tail()


CHART_LEASE = ("--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")  # the chart's values
# kopf's log lines for a handler or daemon that raised (kopf/_core/actions/execution.py)
KOPF_HANDLER_FAILED = re.compile(r"failed (with an exception|temporarily|permanently)")


def test_a_real_kube_apiserver_restart_is_survived(cluster, namespace, tmp_path):
    """Fault: the kube-apiserver process itself is killed and started again with the same
    flags (tests/cluster/apiserver.py: no proxy, etcd keeps the state), a few seconds with
    nothing listening, every connection cut, watches and the Lease's included, while the
    operator runs a 1-cell job; the spec is scaled to 2 once it is back. Expectation: the
    operator lives and still leads (the chart's renew deadline, 10 s, outlasts the outage),
    acts on the edit: 2/2, the first cell kept (same pod, restarts 0); no kopf handler or
    daemon failed; the new process appends to the same audit log (the edit is in it), whose
    invariants hold (checked after the test)."""
    install_crd(cluster)
    kube = Kube(cluster, namespace)
    op = OperatorProcess(cluster, namespace, tmp_path, identity="op-a", extra_args=CHART_LEASE)
    try:
        kube.apply(make_rljob("phoenix", replicas=1))
        wait_for(lambda: converged(kube, "phoenix", 1), 120, what="1/1 before the restart")
        pods = live_engine_pods(kube, "phoenix")
        restart = restart_apiserver(cluster)
        scale(cluster, namespace, "phoenix", 2)
        wait_for(lambda: converged(kube, "phoenix", 2), 120, what="2/2 after the kube-apiserver restart")
        assert set(pods) <= set(live_engine_pods(kube, "phoenix"))
        assert cell_restarts(kube, "phoenix") == {"phoenix-cell-0": 0, "phoenix-cell-1": 0}
        assert op.proc.poll() is None and op.is_leader(), "the operator died or leads no more:\n" + op.log_tail()
        failed = [line for line in op.log_path.read_text().splitlines() if KOPF_HANDLER_FAILED.search(line)]
        assert not failed, "\n".join(failed)
        edits = [e for e in history.read(history.audit_log(cluster), namespace)
                 if e.verb == "patch" and e.resource == "rljobs" and not e.subresource and e.agent.startswith("kubectl")]  # fmt: skip
        assert len(edits) == 1 and edits[0].ok, f"the scale after the restart (down {restart.down_s:.1f} s) is not in the audit log"
    finally:
        op.stop()
        release_rljobs(cluster, namespace)


RELIST = ("--relist", "2")  # the operator's one LIST of RLJobs, every 2 s here (30 s by default)


def watching_rljobs(proxy: ApiProxy) -> Fault:
    """Counts the operator's RLJob watch requests (kopf lists, then watches: once one is seen,
    a job created after is a watch event, not an item of kopf's first list)."""
    return proxy.add(Fault("delay", "GET", "rljobs", watch=True, times=0))


def test_a_dropped_spec_edit_event_is_made_up_for_by_the_relist(cluster, namespace, proxy, operators):
    """Fault: once the job serves 1 cell, every RLJob watch event is dropped (kopf continues
    its watch from the last resourceVersion it saw and never re-lists on its own, so the
    edit to 2 replicas never reaches its view). Expectation: the operator's relist hands the
    newer generation to the job, which converges to 2/2 anyway, the first cell kept (same pod,
    restarts 0)."""
    kube = Kube(cluster, namespace)
    op = operators(*RELIST)
    kube.apply(make_rljob("deafjob", replicas=1))
    wait_for(lambda: converged(kube, "deafjob", 1), 120, what="1/1 before the drops")
    pods = live_engine_pods(kube, "deafjob")
    drop = proxy.add(Fault("drop", "GET", "rljobs", watch=True, times=0))
    scale(cluster, namespace, "deafjob", 2)
    wait_for(lambda: drop.applied > 0, 30, what="the spec edit's watch event dropped")
    wait_for(lambda: converged(kube, "deafjob", 2), 60, what="2/2 with every RLJob event dropped")
    assert set(pods) <= set(live_engine_pods(kube, "deafjob"))
    assert cell_restarts(kube, "deafjob") == {"deafjob-cell-0": 0, "deafjob-cell-1": 0}
    assert op.proc.poll() is None, "the operator died:\n" + op.log_tail()


def deletion_nudged_by(nudged: str) -> Any:
    """Matches the events of a deletion mark that carry no nudge of the relist since `nudged`."""

    def matches(event: dict[str, Any]) -> bool:
        meta = event.get("object", {}).get("metadata") or {}
        return bool(meta.get("deletionTimestamp")) and (meta.get("annotations") or {}).get(NUDGE_ANNOTATION) == nudged

    return matches


def test_a_dropped_added_event_is_picked_up_by_the_relist(cluster, namespace, proxy, operators):
    """Fault: the ADDED event of a new RLJob is dropped, later the MODIFIED event of its
    deletion (kopf re-lists only after a 410, so without more it would never start the job,
    nor stop it and remove its finalizer). Expectation: the relist finds the job kopf holds no
    daemon for on two lists in a row and nudges it (an annotation: kopf's watch sees that),
    so it converges to 1/1; the same for the deletion kopf did not see: the RLJob is gone,
    its finalizer removed. The audit log's invariants hold (nothing created after the
    deletion mark)."""
    kube = Kube(cluster, namespace)
    watches = watching_rljobs(proxy)
    drop = proxy.add(Fault("drop", "GET", "rljobs", watch=True, times=1))
    op = operators(*RELIST)
    wait_for(lambda: watches.matched > 0, 60, what="the operator's RLJob watch open")
    kube.apply(make_rljob("unheard", replicas=1))
    wait_for(lambda: drop.applied == 1, 30, what="the new job's ADDED event dropped")
    wait_for(lambda: converged(kube, "unheard", 1), 60, what="1/1 though kopf never saw the job's ADDED event")
    meta = json.loads(cluster.kubectl("get", "rlj", "unheard", "-n", namespace, "-o", "json").stdout)["metadata"]
    nudged = (meta.get("annotations") or {}).get(NUDGE_ANNOTATION)
    assert nudged, meta  # the relist's nudge, not a watch reconnect, made kopf see the job
    # every event of the deletion mark, until the relist's annotation comes with one
    deletion = proxy.add(Fault("drop", "GET", "rljobs", watch=True, times=0, event=deletion_nudged_by(nudged)))
    cluster.kubectl("delete", "rlj", "unheard", "-n", namespace, "--wait=false")
    wait_for(lambda: deletion.applied > 0, 30, what="the deletion's watch event dropped")
    wait_for(
        lambda: cluster.kubectl("get", "rlj", "unheard", "-n", namespace, check=False).returncode != 0,
        60,
        what="the RLJob deleted (finalizer removed) though kopf never saw its deletion event",
    )
    assert op.proc.poll() is None, "the operator died:\n" + op.log_tail()


def test_dropped_engine_pod_events_still_reach_ready_and_replace_a_deleted_pod(
    cluster, namespace, proxy, operators
):
    """Fault: every event of the operator's engine pod watch is dropped (ADDED, MODIFIED,
    DELETED: the watch that wakes a job waiting on its pods, list_watch).
    Expectation: the passes' own pod lists (poll and resync) see what the watch does not: the
    job reaches 2/2, and an engine pod deleted by hand is replaced: its cell recreated once
    (restarts 1, generation 1, waiting for weights as a new cell does), the other untouched; the audit log shows one live pod
    per slot throughout and restart counts equal to the recreations (history invariants)."""
    kube = Kube(cluster, namespace)
    drop = proxy.add(Fault("drop", "GET", "pods", watch=True, times=0))
    op = operators()
    kube.apply(make_rljob("podless", replicas=2))
    wait_for(lambda: converged(kube, "podless", 2), 120, what="2/2 with every engine pod event dropped")
    assert drop.applied > 0, "no pod watch event was dropped"
    assert live_engine_pods(kube, "podless") == ["podless-cell-0-g0-0", "podless-cell-1-g0-0"]
    seen = drop.applied
    cluster.kubectl("delete", "pod", "podless-cell-1-g0-0", "-n", namespace, "--wait=false")

    def replaced() -> bool:  # a new cell without a trainer waits for the next weight update
        states = {c["name"]: c.get("state") for c in kube.status("podless").get("engines") or []}
        return live_engine_pods(kube, "podless") == ["podless-cell-0-g0-0", "podless-cell-1-g1-0"] and states == {
            "podless-cell-0": "Serving", "podless-cell-1": "PendingWeights"}  # fmt: skip

    wait_for(replaced, 60, what="the deleted engine pod's cell recreated with every pod event dropped")
    assert drop.applied > seen, "the deletion's pod events were not dropped"
    assert cell_restarts(kube, "podless") == {"podless-cell-0": 0, "podless-cell-1": 1}
    assert op.proc.poll() is None, "the operator died:\n" + op.log_tail()


def not_recorded_answers(op: OperatorProcess) -> float:
    """How many end_update_weights calls the operator answered 503 (its /metrics)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in op.metrics().splitlines()
               if line.startswith("rljob_controller_api_calls_total{")
               and 'verb="end_update_weights"' in line and 'code="503"' in line)


async def end_while_status_writes_fail(op: OperatorProcess, proxy: ApiProxy, namespace: str, token: str) -> None:
    """Open a window, then end it while every status write fails; lift the fault once the
    operator has answered end with 503 at least twice, and let the client's retry finish."""
    client = InferenceControllerClient(op.api, "job", namespace, token=token, token_file=None, holder="trainer-0",
                                       retry_timeout=120.0)
    try:
        window = await client.start_update_weights("trainer-0")
        failing = proxy.add(Fault("status", "PATCH", "status", status=500, times=0))
        try:
            ending = asyncio.ensure_future(client.end_update_weights(window.snapshot, "7"))
            deadline = asyncio.get_running_loop().time() + 60
            while not ending.done() and await asyncio.to_thread(not_recorded_answers, op) < 2:
                assert asyncio.get_running_loop().time() < deadline, "end was never answered NotRecorded"
                await asyncio.sleep(0.2)
        finally:
            proxy.faults.remove(failing)
        await asyncio.wait_for(ending, 120)
    finally:
        await client.close()


def test_a_status_write_that_fails_after_end_update_weights_is_retried_and_recorded_once(
    cluster, namespace, proxy, operators
):
    """An API-server error was answered as a refusal (409, final for the trainer): the window's
    end was lost. It is 503 NotRecorded now; the client repeats end and the outcome is written once."""
    kube = Kube(cluster, namespace)
    token, _ = control_rbac(kube, "job")
    kube.apply(make_rljob("job", replicas=2))
    op = operators()
    wait_for(lambda: converged(kube, "job", 2), 180, what="2 cells serving")
    asyncio.run(end_while_status_writes_fail(op, proxy, namespace, token))
    assert not_recorded_answers(op) >= 2, "the end's status write never failed: the test proved nothing"
    wait_for(lambda: kube.status("job").get("weightVersion") == "7", 60, what="weightVersion 7 in status")
    status = kube.status("job")
    assert not status.get("lock"), status.get("lock")
    assert set(engine_states(status).values()) == {"Serving"}
    updated = [e for e in kube.events("job") if e.get("reason") == "WeightsUpdated"]
    assert len(updated) == 1 and (updated[0].get("count") or 1) == 1, updated
