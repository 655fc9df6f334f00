"""Engine faults on the test cluster: real engine processes (the stand-in, run by the cluster's
agent) under a real operator and kube-apiserver.

Faults and what the spec says must follow (health: every 1 s, timeout 1 s, 2 failures):

* a hung engine (SIGSTOP: its TCP socket accepts, nothing answers), a slow one (`/health`
  answers after 3 s, past the probe timeout), one answering a proxy's `502 Bad Gateway` HTML
  page and one answering bytes that are not HTTP (another program on the port), in one job:
  each cell turns Unhealthy after `failureThreshold` consecutive failed probes (the Event says
  so and gives the last probe's error: no pod failed, the processes live on) and is recreated
  at the next generation; its stopped process is gone with its pod;
* one pod of a two-pod (multi-node SGLang) cell lost (SIGKILL): the whole cell is recreated,
  both pods at the next generation and no pod of the old generation left, never a half cell
  serving;
* an engine refusing offload (`/sleep` answers 500), then one refusing onload (`/wake_up`),
  through the operator's controller API with the trainer's token: the answer names the cell
  and why, a warning Event says so; the cell whose offload failed keeps serving, the one whose
  onload failed cannot serve (its weights are gone) and is marked Unhealthy and recreated
  within its restart budget, never left Offloaded.

Nothing is lost: the healthy cell of the first job is never recreated (generation and
restarts unchanged), restart counts equal the recreations seen.
"""

from __future__ import annotations

import contextlib
import os
import signal
import urllib.request
from typing import Any

import pytest

from tests.integration.operator_harness import (
    PID_ANNOTATION,
    Kube,
    OperatorProcess,
    call,
    control_rbac,
    engine_states,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture
def kube(cluster, namespace) -> Kube:
    return Kube(cluster, namespace)


@pytest.fixture
def operator(cluster, namespace, tmp_path):
    install_crd(cluster)
    op = OperatorProcess(cluster, namespace, tmp_path)
    yield op
    op.stop()
    release_rljobs(cluster, namespace)


def pid_of(kube: Kube, pod: str) -> int:
    return int(wait_for(lambda: (kube.get("pod", pod) or {}).get("metadata", {}).get("annotations", {}).get(PID_ANNOTATION),
                        60, what=f"pid of {pod}"))  # fmt: skip


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        return "Z" not in open(f"/proc/{pid}/stat").read().split()[2]
    return False


def engine(status: dict[str, Any], cell: str) -> dict[str, Any]:
    return next(e for e in status.get("engines") or [] if e["name"] == cell)


def cell_events(kube: Kube, job: str, cell: str, reason: str) -> list[str]:
    return [e["message"] for e in kube.events(job) if e["reason"] == reason and f"[{cell}]" in e["message"]]


def standin(ip: str, route: str) -> None:
    """POST one of the stand-in's /standin/ fault switches."""
    urllib.request.urlopen(urllib.request.Request(f"http://{ip}:8000/standin/{route}", method="POST"), timeout=5).read()


def test_hung_slow_and_garbage_answering_engines_fail_their_probes_and_are_recreated(kube, operator):
    kube.apply(make_rljob("faulty", replicas=5))
    wait_for(lambda: kube.status("faulty").get("ready") == "5/5", 120, what="5/5 serving")
    pods = {p["metadata"]["labels"]["rljob.io/cell-index"]: p for p in kube.engine_pods("faulty")}
    hung_pid = pid_of(kube, pods["1"]["metadata"]["name"])
    try:
        os.kill(hung_pid, signal.SIGSTOP)
        standin(pods["2"]["status"]["podIP"], "slow?seconds=3")
        standin(pods["3"]["status"]["podIP"], "garbage?kind=html")
        standin(pods["4"]["status"]["podIP"], "garbage?kind=bytes")
        last_errors = {"faulty-cell-1": "timed out", "faulty-cell-2": "timed out",
                       "faulty-cell-3": "HTTP 502", "faulty-cell-4": "malformed reply"}
        for cell, error in last_errors.items():
            wait_for(lambda c=cell: engine(kube.status("faulty"), c)["generation"] == 1
                     and engine(kube.status("faulty"), c)["state"] in ("Starting", "PendingWeights", "Serving"),
                     120, what=f"{cell} recreated at generation 1 and answering")  # fmt: skip
            unhealthy = cell_events(kube, "faulty", cell, "CellUnhealthy")
            assert unhealthy and "2 consecutive failed probes" in unhealthy[0] and error in unhealthy[0], unhealthy
            assert cell_events(kube, "faulty", cell, "CellReplaced"), f"{cell}: no CellReplaced event"
        wait_for(lambda: not alive(hung_pid), 60, what="the hung engine's process gone with its pod")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung_pid, signal.SIGKILL)
    status = kube.status("faulty")
    healthy = engine(status, "faulty-cell-0")
    assert (healthy["generation"], healthy["restarts"], healthy["state"]) == (0, 0, "Serving")
    assert [engine(status, f"faulty-cell-{i}")["restarts"] for i in (1, 2, 3, 4)] == [1, 1, 1, 1]
    assert status["restartsTotal"] == 4
    names = sorted(
        p["metadata"]["name"]
        for p in kube.engine_pods("faulty")
        if not p["metadata"].get("deletionTimestamp")
    )
    assert names == ["faulty-cell-0-g0-0", *(f"faulty-cell-{i}-g1-0" for i in (1, 2, 3, 4))]


def test_a_lost_pod_of_a_multi_node_cell_recreates_the_whole_cell(kube, operator):
    job = make_rljob("wide", replicas=1)
    inf = job["spec"]["inference"]
    inf.update(engine="sglang", gpusPerEngine=16, gpusPerNode=8)  # one cell = two 8-GPU pods
    inf.pop("tensorParallelSize", None)
    kube.apply(job)
    wait_for(lambda: kube.status("wide").get("ready") == "1/1", 120, what="the two-pod cell serving")
    assert sorted(engine(kube.status("wide"), "wide-cell-0")["pods"]) == [
        "wide-cell-0-g0-0",
        "wide-cell-0-g0-1",
    ]
    os.kill(pid_of(kube, "wide-cell-0-g0-1"), signal.SIGKILL)  # pod 1 of the cell, not its head

    def recreated() -> bool:
        e = engine(kube.status("wide"), "wide-cell-0")
        return e["generation"] == 1 and e["state"] in ("Starting", "PendingWeights", "Serving")

    wait_for(recreated, 120, what="the whole cell recreated at generation 1")
    e = engine(kube.status("wide"), "wide-cell-0")
    assert sorted(e["pods"]) == ["wide-cell-0-g1-0", "wide-cell-0-g1-1"] and e["restarts"] == 1
    unhealthy = cell_events(kube, "wide", "wide-cell-0", "CellUnhealthy")
    assert unhealthy and "wide-cell-0-g0-1" in unhealthy[0], unhealthy  # the lost pod named
    wait_for(lambda: not [p for p in kube.engine_pods("wide") if "-g0-" in p["metadata"]["name"]], 60,
             what="both pods of generation 0 deleted, the head too")  # fmt: skip


def test_engines_refusing_offload_and_onload_are_reported_and_never_left_offloaded(kube, operator):
    kube.apply(make_rljob("memory", replicas=2))
    trainer, _ = control_rbac(kube, "memory")
    wait_for(lambda: kube.status("memory").get("ready") == "2/2", 120, what="2/2 serving")
    ip = {p["metadata"]["labels"]["rljob.io/cell-index"]: p["status"]["podIP"] for p in kube.engine_pods("memory")}

    def warned(reason: str, cell: str) -> list[str]:
        return [e["message"] for e in kube.events("memory") if e["reason"] == reason and e["type"] == "Warning"
                and cell in e["message"]]  # fmt: skip

    # Offload: cell 1's engine refuses to sleep. It keeps serving; cell 0 is offloaded.
    standin(ip["1"], "refuse?route=sleep")
    code, body, _ = call(operator.api, kube.ns, "memory", "offload", {"tags": ["weights"]}, trainer)
    assert code == 200 and list(body["failed"]) == ["memory-cell-1"] and "500" in body["failed"]["memory-cell-1"], body
    wait_for(lambda: warned("Offloaded", "memory-cell-1"), 30, what="a warning Offloaded Event naming cell 1")
    wait_for(lambda: engine_states(kube.status("memory")) == {"memory-cell-0": "Offloaded", "memory-cell-1": "Serving"},
             30, what="cell 0 Offloaded, cell 1 still Serving in status")  # fmt: skip

    # Onload: cell 0's engine refuses to wake up. Its weights are gone: Unhealthy, then recreated.
    standin(ip["0"], "refuse?route=wake_up")
    code, body, _ = call(operator.api, kube.ns, "memory", "onload", {"tags": ["weights"]}, trainer)
    assert code == 200 and list(body["failed"]) == ["memory-cell-0"], body

    def recreated() -> bool:
        e = engine(kube.status("memory"), "memory-cell-0")
        return e["generation"] == 1 and e["state"] in ("Starting", "PendingWeights", "Serving")

    wait_for(recreated, 120, what="cell 0 recreated at generation 1, not left Offloaded")
    unhealthy = cell_events(kube, "memory", "memory-cell-0", "CellUnhealthy")
    assert unhealthy and "onload failed" in unhealthy[0], unhealthy
    status = kube.status("memory")
    assert (engine(status, "memory-cell-0")["restarts"], engine(status, "memory-cell-1")["restarts"]) == (1, 0)
    assert engine(status, "memory-cell-1")["state"] == "Serving" and not engine(status, "memory-cell-0").get("memory")
