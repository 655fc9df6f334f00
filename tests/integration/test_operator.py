"""The operator against the real test control plane: one RLJob, engines as real processes.

Each test runs `rljob-operator --namespace <ns>` as a subprocess with the test kubeconfig and
its controller API on a loopback port, applies the realistic example adjusted to the test
cluster (tests/integration/operator_harness.py: `make_rljob`), and watches the cluster the
way a user would (kubectl get/describe, Events). Engine cells are light stand-in servers
(tests/engine_standin) except where a test says otherwise; health checks run every 1 s.
"""

from __future__ import annotations

import os
import re
import signal
import urllib.request

import pytest

from tests.integration.operator_harness import (
    PID_ANNOTATION,
    PROCESS_LABEL,
    Kube,
    OperatorProcess,
    call,
    condition,
    control_rbac,
    engine_states,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def crd(cluster):
    install_crd(cluster)
    return cluster


@pytest.fixture
def kube(crd, namespace) -> Kube:
    return Kube(crd, namespace)


@pytest.fixture
def operator(crd, namespace, tmp_path):
    procs: list[OperatorProcess] = []

    def start(identity: str = "op-a") -> OperatorProcess:
        op = OperatorProcess(crd, namespace, tmp_path, identity=identity)
        procs.append(op)
        return op

    yield start
    for op in procs:
        op.stop()
    release_rljobs(crd, namespace)


def serving_pod_ips(kube: Kube, job: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"].get("podIP", "") for p in kube.engine_pods(job)
            if p["metadata"].get("labels", {}).get("rljob.io/serving") == "true"}


def open_window(api: str, kube: Kube, job: str, token: str) -> dict:
    code, body, _ = call(api, kube.ns, job, "start_update_weights", {"holder": "trainer-0"}, token)
    assert code == 200, body
    return body


def test_fleet_comes_up_and_kubectl_shows_engine_health(kube, operator, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    kube.apply(make_rljob("fleet", replicas=4, gate_dir=gate))
    op = operator()
    # Engines hold before listening until the gate opens: the printer column must read 0/4.
    wait_for(lambda: kube.printer_columns("fleet").get("READY") == "0/4", 60, what="READY 0/4")
    wait_for(lambda: all(s == "Starting" for s in engine_states(kube.status("fleet")).values())
             and len(engine_states(kube.status("fleet"))) == 4, 90, what="4 cells Starting")
    (gate / "open").touch()
    wait_for(lambda: kube.printer_columns("fleet").get("READY") == "4/4", 90, what="READY 4/4")
    assert kube.printer_columns("fleet")["PHASE"] == "Running"

    status = kube.status("fleet")
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "EnginesHealthy")["status"] == "True"
    assert status["observedGeneration"] == kube.rljob("fleet")["metadata"]["generation"]
    assert len(serving_pod_ips(kube, "fleet")) == 4  # the <job>-engines Service selects these
    svc = kube.get("service", "fleet-engines")
    assert svc is not None and svc["spec"]["selector"]["rljob.io/serving"] == "true"
    assert kube.get("service", "fleet-cells") is not None
    assert kube.get("deployment", "fleet-rollout") is not None and kube.get("service", "fleet-rollout") is not None

    described = kube.cluster.kubectl("describe", "rlj", "fleet", "-n", kube.ns).stdout
    assert "Engines:" in described and len(re.findall(r"\n\s+State:\s+Serving\n", described)) == 4
    reasons = {e["reason"] for e in kube.events("fleet")}
    assert {"CellServing", "AllEnginesServing"} <= reasons
    assert 'rljob_cells{job="fleet",namespace="' in op.metrics()


def test_killed_engine_is_replaced_and_serves_only_after_the_next_weight_update(kube, operator):
    kube.apply(make_rljob("heal", replicas=2))
    op = operator()
    trainer, _ = control_rbac(kube, "heal")
    wait_for(lambda: kube.status("heal").get("ready") == "2/2", 120, what="2/2 serving")

    victim = next(p for p in kube.engine_pods("heal") if p["metadata"]["labels"]["rljob.io/cell-index"] == "1")
    pid = int(wait_for(lambda: kube.get("pod", victim["metadata"]["name"])["metadata"]["annotations"].get(PID_ANNOTATION),
                       30, what="pid annotation"))
    os.kill(pid, signal.SIGKILL)

    wait_for(lambda: engine_states(kube.status("heal")).get("heal-cell-1") == "Unhealthy"
             or kube.status("heal")["engines"][1]["generation"] == 1, 60, what="cell 1 unhealthy or replaced")
    # Replaced at generation 1, healthy again, but not serving: its weights are stale.
    wait_for(lambda: (e := kube.status("heal")["engines"][1])["generation"] == 1 and e["state"] == "PendingWeights",
             90, what="cell 1 recreated and PendingWeights")
    status = kube.status("heal")
    assert status["ready"] == "1/2" and status["engines"][1]["restarts"] == 1
    assert [p["metadata"]["name"] for p in kube.engine_pods("heal") if "cell-1" in p["metadata"]["name"]] == ["heal-cell-1-g1-0"]
    assert len(serving_pod_ips(kube, "heal")) == 1
    reasons = [e["reason"] for e in kube.events("heal")]
    assert "CellUnhealthy" in reasons and "CellReplaced" in reasons

    window = open_window(op.api, kube, "heal", trainer)
    assert window["snapshot"] == {"heal-cell-0": 0, "heal-cell-1": 1}
    assert kube.status("heal")["lock"]["holder"] == "trainer-0"  # in status before the answer
    code, body, _ = call(op.api, kube.ns, "heal", "end_update_weights", {"snapshot": window["snapshot"], "weightVersion": "2"}, trainer)
    assert code == 200, body
    status = kube.status("heal")
    assert status["ready"] == "2/2" and status["weightVersion"] == "2" and "lock" not in status
    wait_for(lambda: len(serving_pod_ips(kube, "heal")) == 2, 30, what="both cells labelled serving")
    assert any(e["reason"] == "WeightsUpdated" and "v2" in e["message"] for e in kube.events("heal"))


def test_failing_health_probes_make_a_cell_unhealthy_and_it_is_recreated(kube, operator):
    kube.apply(make_rljob("probe", replicas=1))
    operator()
    wait_for(lambda: kube.status("probe").get("ready") == "1/1", 120, what="1/1")
    pod = kube.engine_pods("probe")[0]
    ip = pod["status"]["podIP"]
    urllib.request.urlopen(urllib.request.Request(f"http://{ip}:8000/standin/unhealthy", method="POST"), timeout=5).read()
    # The process lives on: only failureThreshold (2) failed probes can mark the cell.
    wait_for(lambda: kube.status("probe")["engines"][0]["generation"] == 1, 60, what="cell recreated at generation 1")
    unhealthy = [e for e in kube.events("probe") if e["reason"] == "CellUnhealthy"]
    assert unhealthy and "consecutive failed probes" in unhealthy[0]["message"]


def test_crash_loop_stops_at_the_restart_budget(kube, operator):
    kube.apply(make_rljob("crash", replicas=2, crash_cells="1", max_restarts=1, backoff=0.2))
    operator()
    # Cell 1 can spend its budget before cell 0's first probe made it Serving: wait for both.
    wait_for(lambda: condition(kube.status("crash"), "EnginesHealthy").get("reason") == "RestartBudgetExhausted"
             and engine_states(kube.status("crash")).get("crash-cell-0") == "Serving",
             120, what="EnginesHealthy=False/RestartBudgetExhausted, cell 0 serving")  # fmt: skip
    status = kube.status("crash")
    assert condition(status, "EnginesHealthy")["status"] == "False"
    assert engine_states(status) == {"crash-cell-0": "Serving", "crash-cell-1": "Failed"}
    assert status["engines"][1]["restarts"] == 1 and status["phase"] == "Running"  # degraded, not failed
    warnings = [e for e in kube.events("crash") if e["type"] == "Warning" and e["reason"] == "RestartBudgetExhausted"]
    assert warnings
    # The budget holds: no further generations appear.
    wait_for(lambda: not any("cell-1" in p["metadata"]["name"] for p in kube.engine_pods("crash")), 60,
             what="pods of the failed cell deleted")
    assert kube.status("crash")["engines"][1]["generation"] == 1


def test_controller_api_refuses_unauthenticated_and_unauthorized_callers(kube, operator):
    kube.apply(make_rljob("authz", replicas=1))
    op = operator()
    trainer, nobody = control_rbac(kube, "authz")
    wait_for(lambda: kube.status("authz").get("ready") == "1/1", 120, what="1/1")
    code, body, _ = call(op.api, kube.ns, "authz", "cells")
    assert code == 401 and body["reason"] == "Unauthenticated"
    code, body, _ = call(op.api, kube.ns, "authz", "cells", token="not-a-token")
    assert code == 401
    code, body, _ = call(op.api, kube.ns, "authz", "cells", token=nobody)
    assert code == 403 and "nobody" in body["error"] and "rljobs/control" in body["error"]
    code, body, _ = call(op.api, kube.ns, "authz", "cells", token=trainer)
    assert code == 200 and body["engines"][0]["state"] == "Serving"
    code, body, _ = call(op.api, kube.ns, "authz", "offload", {"tags": ["kv_cache"]}, token=nobody)
    assert code == 403
    assert "lock" not in kube.status("authz")


def test_abort_stops_only_the_snapshot_participants(kube, operator, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "cell-0").touch()  # cell 0 serves; cell 1 stays Starting behind the gate
    kube.apply(make_rljob("abort", replicas=2, gate_dir=gate))
    op = operator()
    trainer, _ = control_rbac(kube, "abort")
    wait_for(lambda: engine_states(kube.status("abort")) == {"abort-cell-0": "Serving", "abort-cell-1": "Starting"},
             120, what="cell 0 Serving, cell 1 Starting")
    window = open_window(op.api, kube, "abort", trainer)
    assert window["snapshot"] == {"abort-cell-0": 0}
    code, body, _ = call(op.api, kube.ns, "abort", "abort_update_weights", {"snapshot": window["snapshot"]}, trainer)
    assert code == 200 and body["stopped"] == ["abort-cell-0"]
    status = kube.status("abort")
    assert "lock" not in status
    assert status["engines"][0]["generation"] == 1 and status["engines"][1]["generation"] == 0


def test_expired_lock_is_released_and_reported(kube, operator):
    kube.apply(make_rljob("expiry", replicas=1, lock_timeout=3))
    op = operator()
    trainer, _ = control_rbac(kube, "expiry")
    wait_for(lambda: kube.status("expiry").get("ready") == "1/1", 120, what="1/1")
    window = open_window(op.api, kube, "expiry", trainer)
    assert kube.status("expiry")["lock"]["holder"] == "trainer-0"
    wait_for(lambda: "lock" not in kube.status("expiry"), 30, what="expired lock released in status")
    assert any(e["reason"] == "LockExpired" and e["type"] == "Warning" for e in kube.events("expiry"))
    code, body, _ = call(op.api, kube.ns, "expiry", "end_update_weights", {"snapshot": window["snapshot"]}, trainer)
    assert code == 409 and body["reason"] == "SnapshotMismatch"  # the trainer learns its window is gone


def test_operator_restart_mid_window_keeps_lock_and_cells(kube, operator):
    kube.apply(make_rljob("restart", replicas=2))
    op = operator()
    trainer, _ = control_rbac(kube, "restart")
    wait_for(lambda: kube.status("restart").get("ready") == "2/2", 120, what="2/2")
    window = open_window(op.api, kube, "restart", trainer)
    pods_before = sorted(p["metadata"]["name"] for p in kube.engine_pods("restart"))

    assert op.stop(signal.SIGKILL) == -signal.SIGKILL  # a crash: no lease release, no cleanup
    op2 = operator("op-b")
    wait_for(op2.is_leader, 30, what="new operator leads after the lease expired")
    # Until its daemon has restored the job, the new leader answers 503 + Retry-After: retry.
    code, body, _ = wait_for(lambda: (r := call(op2.api, kube.ns, "restart", "cells", token=trainer))[0] == 200 and r,
                             30, what="controller restored on op-b")
    assert body["lock"]["holder"] == "trainer-0" and body["lock"]["snapshot"] == window["snapshot"]
    assert sorted(p["metadata"]["name"] for p in kube.engine_pods("restart")) == pods_before  # no duplicates
    code, body, _ = call(op2.api, kube.ns, "restart", "end_update_weights",
                         {"snapshot": window["snapshot"], "weightVersion": "5"}, trainer)
    assert code == 200, body
    status = kube.status("restart")
    assert status["weightVersion"] == "5" and status["ready"] == "2/2" and "lock" not in status


def test_two_replicas_only_the_leader_acts_and_the_standby_answers_503(kube, operator):
    kube.apply(make_rljob("pair", replicas=1))
    a = operator("op-a")
    wait_for(a.is_leader, 30, what="op-a leads")
    b = operator("op-b")
    trainer, _ = control_rbac(kube, "pair")
    wait_for(lambda: kube.status("pair").get("ready") == "1/1", 120, what="1/1")
    assert not b.is_leader() and b.healthz()["detail"] == "standby"
    code, body, headers = call(b.api, kube.ns, "pair", "cells", token=trainer)
    assert code == 503 and body["reason"] == "NotLeader" and "op-a" in body["error"] and headers.get("Retry-After")
    assert "rljob_operator_leader 0.0" in b.metrics()
    assert call(a.api, kube.ns, "pair", "cells", token=trainer)[0] == 200

    assert a.stop(signal.SIGTERM) == 0  # a clean shutdown releases the lease at once
    wait_for(b.is_leader, 20, what="op-b takes over")
    wait_for(lambda: call(b.api, kube.ns, "pair", "cells", token=trainer)[0] == 200, 30, what="op-b serves the API")
    assert len(kube.engine_pods("pair")) == 1


def test_suspend_deletes_engine_pods_and_resume_recreates_them(kube, operator):
    kube.apply(make_rljob("susp", replicas=2))
    operator()
    wait_for(lambda: kube.status("susp").get("ready") == "2/2", 120, what="2/2")
    kube.cluster.kubectl("patch", "rlj", "susp", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: condition(kube.status("susp"), "Suspended").get("message") == "engine and trainer pods deleted",
             60, what="Suspended=True, pods gone")
    assert kube.engine_pods("susp") == [] and kube.status("susp")["phase"] == "Suspended"
    assert kube.get("rljob", "susp") is not None and kube.get("service", "susp-engines") is not None
    kube.cluster.kubectl("patch", "rlj", "susp", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: kube.status("susp").get("ready") == "2/2", 120, what="2/2 after resume")
    assert condition(kube.status("susp"), "Suspended")["status"] == "False"


def test_replicas_change_is_reconciled_live(kube, operator):
    kube.apply(make_rljob("scale", replicas=1))
    operator()
    wait_for(lambda: kube.status("scale").get("ready") == "1/1", 120, what="1/1")
    kube.cluster.kubectl("patch", "rlj", "scale", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"inference":{"replicas":3}}}')
    wait_for(lambda: kube.status("scale").get("ready") == "3/3", 120, what="3/3")
    kube.cluster.kubectl("patch", "rlj", "scale", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"inference":{"replicas":1}}}')
    wait_for(lambda: kube.status("scale").get("ready") == "1/1" and len(kube.engine_pods("scale")) == 1, 60, what="back to 1")


def test_delete_cleans_up_every_child(kube, operator):
    kube.apply(make_rljob("gone", replicas=2))
    operator()
    wait_for(lambda: kube.status("gone").get("ready") == "2/2", 120, what="2/2")
    kube.cluster.kubectl("delete", "rlj", "gone", "-n", kube.ns, "--wait=false")
    wait_for(lambda: kube.get("rljob", "gone") is None, 60, what="RLJob gone (finalizer removed)")
    wait_for(lambda: kube.engine_pods("gone") == [] and kube.get("service", "gone-engines") is None
             and kube.get("deployment", "gone-rollout") is None, 90, what="children garbage-collected")




def test_job_succeeds_with_its_trainer_and_is_deleted_after_its_ttl(kube, operator):
    kube.cluster.kubectl("create", "serviceaccount", "rljob-trainer", "-n", kube.ns)  # the example's trainer SA
    kube.apply(make_rljob("ttl", replicas=1, trainer_job=True, ttl_after_finished=5))
    operator()
    wait_for(lambda: kube.status("ttl").get("phase") == "Succeeded", 120, what="Succeeded when the trainer Job completes")
    status = kube.status("ttl")
    assert status["completionTime"] and condition(status, "Progressing")["status"] == "False"
    assert kube.get("job", "ttl-trainer") is not None
    wait_for(lambda: kube.engine_pods("ttl") == [], 60, what="engine pods freed once finished")
    wait_for(lambda: kube.get("rljob", "ttl") is None, 60, what="RLJob deleted after ttlSecondsAfterFinished")


def test_trainer_replicas_change_recreates_the_trainer_job_with_the_new_world_size(kube, operator):
    """A Job's pod template is immutable: the operator deletes and recreates the trainer Job."""
    kube.cluster.kubectl("create", "serviceaccount", "rljob-trainer", "-n", kube.ns)
    job = make_rljob("world", replicas=1, trainer_job=True)
    job["spec"]["trainer"].update(
        command=["python", "-c", "import time; time.sleep(600)"],
        podMetadata={"labels": {PROCESS_LABEL: "process"}},  # a real process: kwok does not complete it
    )
    kube.apply(job)
    operator()

    def world_size() -> tuple[int, str] | None:
        tj = kube.get("job", "world-trainer")
        if not tj or tj["metadata"].get("deletionTimestamp"):
            return None
        env = {e["name"]: e.get("value") for e in tj["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        return tj["spec"]["parallelism"], env.get("WORLD_SIZE", "")

    assert wait_for(world_size, 90, what="trainer Job created") == (1, "1")
    first_uid = kube.get("job", "world-trainer")["metadata"]["uid"]
    kube.cluster.kubectl("patch", "rlj", "world", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"trainer":{"replicas":2}}}')
    wait_for(lambda: world_size() == (2, "2"), 90, what="trainer Job recreated with WORLD_SIZE=2")
    assert kube.get("job", "world-trainer")["metadata"]["uid"] != first_uid
    events = kube.cluster.kubectl("get", "events", "-n", kube.ns, "--field-selector", "involvedObject.name=world", "-o", "name").stdout
    assert events.strip(), "the recreation is reported"
    reasons = kube.cluster.kubectl("get", "events", "-n", kube.ns, "-o", "jsonpath={.items[*].reason}").stdout
    assert "TrainerRecreated" in reasons
