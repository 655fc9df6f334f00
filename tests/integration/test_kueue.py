"""RLJobs queued through the real Kueue controller: one Workload per job, admission, preemption.

Kueue v0.17.0 runs as a process against the test cluster (tests/integration/kueue_harness.py:
its own CRDs and webhooks, `integrations.externalFrameworks: [RLJob.v1alpha1.rljob.io]`); the
operator runs as in tests/integration/test_operator.py, engines are light stand-ins. Each test
gets a ClusterQueue of 16 GPUs on the simulated GPU nodes (CPU pods on the CPU nodes) and a
LocalQueue `rl` in its namespace: the README's "Queueing with Kueue" setup. Every check is
made on what the cluster holds (the Workload Kueue sees, the pods that were created).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.kueue_harness import FLAVORS, PRIORITIES, KueueProcess, kueue_dir, queue_objects
from tests.integration.operator_harness import (
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

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


@pytest.fixture(scope="module")
def kueue(cluster, tmp_path_factory):
    build = kueue_dir()
    if build is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Kueue is not built: tests/cluster/build --print-kueue failed")
        pytest.skip("Kueue is not built (tests/cluster/build)")
    install_crd(cluster)
    proc = KueueProcess(cluster, build, tmp_path_factory.mktemp("kueue"))
    for obj in FLAVORS + PRIORITIES:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    yield proc
    proc.stop()


@pytest.fixture
def kube(kueue, cluster, namespace) -> Kube:
    return Kube(cluster, namespace)


@pytest.fixture
def queue(kube):
    """ClusterQueue `rl-<namespace>` (16 GPUs) and LocalQueue `rl`; the ClusterQueue is deleted after."""
    name = f"rl-{kube.ns}"
    for obj in queue_objects(name, kube.ns):
        kube.apply(obj)
    wait_for(
        lambda: kueue_condition(kube.get("clusterqueue", name), "Active").get("status") == "True",
        60,
        what=f"ClusterQueue {name} Active",
    )
    yield name
    kube.cluster.kubectl("delete", "clusterqueue", name, "--ignore-not-found", "--wait=false", check=False)
    # Kueue keeps its finalizer while Workloads of the dying namespace still count: drop it, the
    # test is over and nothing is left to account for.
    kube.cluster.kubectl(
        "patch", "clusterqueue", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
    )


@pytest.fixture
def operator(kube, tmp_path):
    op = OperatorProcess(kube.cluster, kube.ns, tmp_path)
    yield op
    op.stop()
    release_rljobs(kube.cluster, kube.ns)


def queued_job(
    name: str,
    *,
    cells: int = 2,
    gpus_per_engine: int = 8,
    priority: str | None = None,
    trainer_gate: Path | None = None,
    trainer_replicas: int = 1,
) -> dict[str, Any]:
    """A test RLJob of cells x gpusPerEngine GPUs in LocalQueue `rl`.

    With `trainer_gate`, the operator's trainer Job runs `trainer_replicas` real processes
    that exit 0 once the gate file exists (the job then Succeeds); else the trainer is a
    workloadRef (not the operator's, not in the Workload).
    """
    job = make_rljob(name, replicas=cells)
    job["metadata"]["labels"] = {QUEUE_LABEL: "rl", **({PRIORITY_LABEL: priority} if priority else {})}
    inf = job["spec"]["inference"]
    inf.update(gpusPerEngine=gpus_per_engine, gpusPerNode=8)
    inf["placement"] = {}  # the flavors' node labels and tolerations must do it
    job["spec"]["rollout"]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    if trainer_gate is not None:
        job["spec"]["trainer"] = {
            "replicas": trainer_replicas,
            "gpusPerReplica": 0,
            "image": "busybox",
            "command": ["sh", "-c", f"while [ ! -e {trainer_gate} ]; do sleep 0.2; done"],
            "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
            "podMetadata": {"labels": {PROCESS_LABEL: "process"}},
        }
    return job


def columns(kube: Kube, job: str) -> dict[str, str]:
    """`kubectl get rlj JOB` by column header, cut at the header's offsets (empty cells stay empty)."""
    header, row = kube.cluster.kubectl("get", "rlj", job, "-n", kube.ns).stdout.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def held_for_quota(kube: Kube, job: str) -> dict[str, Any]:
    """Wait until Kueue's "insufficient quota" reaches status.queue; the status, checked Suspended/Pending."""
    wait_for(
        lambda: "insufficient quota" in queue_status(kube, job).get("message", ""),
        60,
        what=f"{job}: Kueue's message in status.queue",
    )
    status = kube.status(job)
    assert status["phase"] == "Suspended" and status["queue"]["state"] == "Pending", status
    return status


def kueue_condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """A condition of a Kueue object (ClusterQueue, Workload)."""
    return condition((obj or {}).get("status") or {}, type_)


def queue_status(kube: Kube, job: str) -> dict[str, Any]:
    return kube.status(job).get("queue") or {}


def workload(kube: Kube, job: str) -> dict[str, Any]:
    wl = kube.get("workload", f"rljob-{job}")
    assert wl is not None, f"no Workload rljob-{job}"
    return wl


def reasons(kube: Kube, job: str) -> set[str]:
    return {e["reason"] for e in kube.events(job)}


def weight_update(api: str, kube: Kube, job: str, token: str, version: str) -> None:
    code, body, _ = call(api, kube.ns, job, "start_update_weights", {"holder": "trainer-0"}, token)
    assert code == 200, body
    code, body, _ = call(
        api,
        kube.ns,
        job,
        "end_update_weights",
        {"snapshot": body["snapshot"], "weightVersion": version},
        token,
    )
    assert code == 200, body


def describe(kube: Kube, job: str) -> str:
    return kube.cluster.kubectl("describe", "rlj", job, "-n", kube.ns).stdout


def test_two_16_gpu_jobs_share_a_16_gpu_queue_one_after_the_other(kube, queue, operator, tmp_path):
    gate = tmp_path / "first-trainer-done"
    kube.apply(queued_job("first", trainer_gate=gate))
    wait_for(lambda: kube.status("first").get("ready") == "2/2", 120, what="first: 2/2 serving")
    kube.apply(queued_job("second", trainer_gate=tmp_path / "second-trainer-done"))
    second = held_for_quota(kube, "second")
    assert condition(second, "Suspended")["reason"] == "QueuedByKueue"
    assert condition(second, "Admitted")["status"] == "False"
    assert "insufficient quota" in condition(second, "Admitted")["message"]
    assert columns(kube, "second")["QUEUE"] == "Pending"
    assert kube.engine_pods("second") == [] and kube.pods("rljob.io/job=second,rljob.io/role=trainer") == []
    assert columns(kube, "first")["QUEUE"] == "Admitted"
    assert condition(kube.status("first"), "Admitted")["status"] == "True"
    print("\n$ kubectl get rlj\n" + kube.cluster.kubectl("get", "rlj", "-n", kube.ns).stdout)
    print("$ kubectl describe rlj second\n" + describe(kube, "second"))

    gate.touch()  # the first trainer completes: the job Succeeds and its Workload is Finished
    wait_for(lambda: kube.status("first").get("phase") == "Succeeded", 90, what="first Succeeded")
    wait_for(
        lambda: kueue_condition(workload(kube, "first"), "Finished").get("status") == "True",
        30,
        what="first's Workload Finished",
    )
    wait_for(lambda: kube.status("second").get("ready") == "2/2", 120, what="second admitted and 2/2 serving")
    assert queue_status(kube, "second")["state"] == "Admitted"
    assert "WorkloadFinished" in reasons(kube, "first")
    assert {"WorkloadCreated", "Admitted"} <= reasons(kube, "second")


def test_higher_priority_job_preempts_and_the_lower_resumes_with_its_weight_version(kube, queue, operator):
    kube.apply(queued_job("low", priority="rl-low"))
    token, _ = control_rbac(kube, "low")
    wait_for(lambda: kube.status("low").get("ready") == "2/2", 120, what="low: 2/2 serving")
    code, body, _ = call(operator.api, kube.ns, "low", "prepare_rollout", {"rolloutId": 3}, token)
    assert code == 200, body
    weight_update(operator.api, kube, "low", token, "1")
    assert workload(kube, "low")["spec"]["priority"] == 100

    kube.apply(queued_job("high", priority="rl-high"))
    wait_for(
        lambda: kueue_condition(workload(kube, "low"), "Evicted").get("reason") == "Preempted",
        60,
        what="Kueue evicts low (Preempted)",
    )
    wait_for(lambda: kube.engine_pods("low") == [], 60, what="low's engine pods deleted")
    wait_for(lambda: kube.status("high").get("ready") == "2/2", 120, what="high admitted and 2/2 serving")
    low = kube.status("low")
    assert low["phase"] == "Suspended" and queue_status(kube, "low")["state"] == "Pending"
    assert low["weightVersion"] == "1" and low["rolloutId"] == 3 and low.get("lock") is None
    wl = workload(kube, "low")
    assert kueue_condition(wl, "Requeued").get("status") == "True" and wl["status"].get("admission") is None
    assert {"QuotaReleased", "Suspending"} <= reasons(kube, "low")
    print("\n$ kubectl describe rlj low   # preempted\n" + describe(kube, "low"))

    kube.cluster.kubectl("delete", "rlj", "high", "-n", kube.ns)
    wait_for(lambda: kube.get("workload", "rljob-high") is None, 60, what="high's Workload deleted with it")
    wait_for(lambda: queue_status(kube, "low").get("state") == "Admitted", 90, what="low re-admitted")
    # Fresh cells hold the initial weights: they wait for the next update instead of serving version 0.
    wait_for(
        lambda: sorted(engine_states(kube.status("low")).values()) == ["PendingWeights", "PendingWeights"],
        120,
        what="low's cells back, waiting for weights",
    )
    low = kube.status("low")
    assert low["weightVersion"] == "1" and low["rolloutId"] == 3
    weight_update(operator.api, kube, "low", token, "2")
    wait_for(lambda: kube.status("low").get("ready") == "2/2", 60, what="low serving version 2")


def test_a_job_larger_than_the_queue_stays_pending_and_disturbs_nothing(kube, queue, operator):
    kube.apply(queued_job("small", cells=1))
    kube.apply(queued_job("huge", cells=3))  # 24 GPUs in a 16-GPU queue: never fits
    wait_for(lambda: kube.status("small").get("ready") == "1/1", 120, what="small: 1/1 serving")
    huge = held_for_quota(kube, "huge")
    assert "24" in condition(huge, "Admitted")["message"]  # Kueue names the request that does not fit
    assert (
        kube.engine_pods("huge") == []
        and kube.get("workload", "rljob-huge")["status"].get("admission") is None
    )
    small = kube.status("small")
    assert small["phase"] == "Running" and queue_status(kube, "small")["state"] == "Admitted"
    assert "Suspending" not in reasons(kube, "small")


def test_workload_pod_sets_match_the_pods_the_operator_creates(kube, queue, operator, tmp_path):
    # One 16-GPU engine on 8-GPU nodes: a cell of 2 pods; 2 trainer ranks; the executor.
    kube.apply(
        queued_job("shape", cells=1, gpus_per_engine=16, trainer_gate=tmp_path / "never", trainer_replicas=2)
    )
    roles = {"engines": "engine", "executor": "rollout", "trainer": "trainer"}

    def pods_of(role: str) -> list[dict[str, Any]]:
        return [
            p
            for p in kube.pods(f"rljob.io/job=shape,rljob.io/role={role}")
            if not p["metadata"].get("deletionTimestamp")
        ]

    wait_for(lambda: queue_status(kube, "shape").get("state") == "Admitted", 60, what="shape admitted")
    wait_for(
        lambda: (
            len(pods_of("engine")) == 2
            and len(pods_of("rollout")) == 1
            and len(pods_of("trainer")) == 2
            and all(p["spec"].get("nodeName") for r in roles.values() for p in pods_of(r))
        ),
        90,
        what="every pod created and scheduled",
    )
    wl = workload(kube, "shape")
    assert [p["name"] for p in wl["spec"]["podSets"]] == ["engines", "executor", "trainer"]
    assignments = {a["name"]: a for a in wl["status"]["admission"]["podSetAssignments"]}
    flavors = {f["metadata"]["name"]: f["spec"] for f in FLAVORS}
    for pod_set in wl["spec"]["podSets"]:
        pods = pods_of(roles[pod_set["name"]])
        assert pod_set["count"] == len(pods) == assignments[pod_set["name"]]["count"], pod_set["name"]
        want = pod_set["template"]["spec"]["containers"][0].get("resources", {}).get("requests")
        for pod in pods:
            assert pod["spec"]["containers"][0]["resources"].get("requests") == want, pod["metadata"]["name"]
            flavor = flavors[next(iter(assignments[pod_set["name"]]["flavors"].values()))]
            assert flavor["nodeLabels"].items() <= pod["spec"]["nodeSelector"].items(), pod["metadata"][
                "name"
            ]
            for t in flavor.get("tolerations", []):
                assert t in pod["spec"]["tolerations"], pod["metadata"]["name"]
            node = kube.cluster.kubectl("get", "node", pod["spec"]["nodeName"], "-o", "json").stdout
            assert flavor["nodeLabels"].items() <= json.loads(node)["metadata"]["labels"].items()
    engine_gpus = sum(
        int(p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]) for p in pods_of("engine")
    )
    assert engine_gpus == 16
    assert assignments["engines"]["flavors"]["nvidia.com/gpu"] == "gpu-nodes"
    assert assignments["executor"]["flavors"]["cpu"] == "cpu-nodes"


def test_scaling_an_admitted_job_re_admits_it_with_the_new_counts(kube, queue, operator):
    kube.apply(queued_job("scaled", cells=2))
    wait_for(lambda: kube.status("scaled").get("ready") == "2/2", 120, what="scaled: 2/2 serving")
    old_uid = workload(kube, "scaled")["metadata"]["uid"]
    kube.cluster.kubectl(
        "patch", "rlj", "scaled", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"inference":{"replicas":1}}}'
    )
    wait_for(
        lambda: (
            (wl := kube.get("workload", "rljob-scaled")) is not None
            and wl["metadata"]["uid"] != old_uid
            and wl["spec"]["podSets"][0]["count"] == 1
        ),
        60,
        what="a new Workload with 1 engine pod",
    )
    wait_for(
        lambda: (
            kube.status("scaled").get("ready") == "1/1"
            and queue_status(kube, "scaled").get("state") == "Admitted"
        ),
        120,
        what="re-admitted, 1/1 serving",
    )
    assert len(kube.engine_pods("scaled")) == 1
    assert "WorkloadRecreated" in reasons(kube, "scaled")


def test_kueue_webhooks_intercept_only_kueue_resources_and_other_jobs_run_untouched(kueue, kube):
    hooks = []
    for kind, suffix in (
        ("mutatingwebhookconfiguration", "mutating"),
        ("validatingwebhookconfiguration", "validating"),
    ):
        cfg = json.loads(kube.cluster.kubectl("get", kind, f"rljob-test-kueue-{suffix}", "-o", "json").stdout)
        hooks += cfg["webhooks"]
    assert {"mworkload.kb.io", "vworkload.kb.io", "vclusterqueue.kb.io"} <= {h["name"] for h in hooks}
    for hook in hooks:
        assert {g for rule in hook["rules"] for g in rule["apiGroups"]} == {"kueue.x-k8s.io"}, hook["name"]
        assert hook["clientConfig"]["url"].startswith(f"https://127.0.0.1:{kueue.webhook_port}/"), hook[
            "name"
        ]
    # A Job without a queue-name label, while Kueue (with its batch/job integration) runs: left alone.
    kube.apply(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "plain"},
            "spec": {
                "template": {
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
                }
            },
        }
    )
    wait_for(
        lambda: (
            condition((kube.get("job", "plain") or {}).get("status") or {}, "Complete").get("status")
            == "True"
        ),
        60,
        what="a plain Job completes",
    )
    assert kube.get("job", "plain")["spec"].get("suspend") in (None, False)
    workloads = json.loads(kube.cluster.kubectl("get", "workloads", "-n", kube.ns, "-o", "json").stdout)[
        "items"
    ]
    assert workloads == [], "Kueue made a Workload for a Job without a queue-name label"
