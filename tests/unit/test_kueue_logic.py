"""Kueue, the pure parts: the Workload's PodSets, reading Kueue's decision, the status writes it expects."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from rljob_operator.kueue import (
    FlavorPlacement,
    QueuePhase,
    finished_patch,
    placement_with,
    queue_state,
    release_quota_patch,
)
from rljob_operator.manifests.workload import WorkloadPriority, pod_set_counts, pod_sets, workload
from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.children import desired_children
from rljob_operator.reconcile.job_runtime import JobRuntime
from rljob_operator.reconcile.job_status import Observed, build_status
from rljob_operator.reconcile.queueing import QueueSeen, admitted_spec, queue_of, unplaced_flavors
from rljob_operator.registry import JobRegistry

from controller_runtime.api.spec import Placement, RLJobSpec, Toleration
from controller_runtime.clock import FakeClock
from controller_runtime.fakes import FakeEngines, FakePlatform
from tests.unit.test_job_runtime import FakeKube, rljob, settle

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-8b-8gpu.yaml"
URL = "http://rljob-operator.rljob-system.svc:8080"
NOW = "2026-12-01T11:00:00Z"


def job(**inference: Any) -> dict[str, Any]:
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"] = {
        "name": "llama",
        "namespace": "team-a",
        "uid": "u-1",
        "labels": {"kueue.x-k8s.io/queue-name": "rl"},
    }
    obj["spec"]["inference"].update(inference)
    return obj


def cond(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-12-01T10:00:00Z",
    }


def wl(*conditions: dict[str, Any], admission: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "rljob-llama", "resourceVersion": "42", "generation": 1},
        "status": {"conditions": list(conditions), **({"admission": admission} if admission else {})},
    }


ADMISSION = {"clusterQueue": "rl-gpus", "podSetAssignments": [
    {"name": "engines", "flavors": {"cpu": "gpu-nodes", "nvidia.com/gpu": "gpu-nodes"}, "count": 4},
    {"name": "executor", "flavors": {"cpu": "cpu-nodes"}, "count": 1},
]}  # fmt: skip


def test_pod_sets_count_engine_pods_as_cells_times_pods_per_cell_with_their_gpus() -> None:
    sets = pod_sets(job(replicas=3, gpusPerEngine=16, gpusPerNode=8), URL)
    assert pod_set_counts(sets) == {"engines": 6, "executor": 1, "trainer": 1}
    engine = sets[0]["template"]["spec"]["containers"][0]["resources"]
    assert engine["requests"]["nvidia.com/gpu"] == "8" and engine["limits"]["nvidia.com/gpu"] == "8"
    trainer = sets[2]["template"]["spec"]["containers"][0]["resources"]
    assert trainer["requests"]["nvidia.com/gpu"] == "8"


def test_pod_sets_leave_out_what_the_operator_does_not_run() -> None:
    obj = job(replicas=0)
    obj["spec"]["trainer"] = {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "mine"}}
    assert pod_set_counts(pod_sets(obj, URL)) == {"executor": 1}


def test_a_job_without_rollout_asks_no_quota_for_an_executor() -> None:
    obj = job(replicas=2)
    obj["spec"]["trainer"] = {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "mine"}}
    del obj["spec"]["rollout"]
    assert pod_set_counts(pod_sets(obj, URL)) == {"engines": 2}


def test_pod_sets_count_a_rayclusters_head_and_workers_with_their_requests() -> None:
    """KubeRay creates the Ray pods, but they run for this job: Kueue must reserve their quota
    (they were left out, so an admitted job could overrun its ClusterQueue)."""
    obj = job(replicas=1)
    obj["spec"]["rollout"]["rayCluster"] = {"workers": 3}
    obj["spec"]["rollout"]["resources"] = {"requests": {"cpu": "2", "memory": "4Gi"}}
    sets = {s["name"]: s for s in pod_sets(obj, URL)}
    assert pod_set_counts(list(sets.values())) == {"engines": 1, "executor": 1, "ray-head": 1, "ray-workers": 3,
                                                   "trainer": 1}
    for name in ("ray-head", "ray-workers"):
        (container,) = sets[name]["template"]["spec"]["containers"]
        assert container["resources"]["requests"]["cpu"] == "2", (name, container)
    assert pod_set_counts(pod_sets(job(replicas=1), URL)).keys() == {"engines", "executor", "trainer"}


def test_workload_is_owned_by_the_rljob_and_carries_queue_and_priority() -> None:
    w = workload(
        job(), "rl", URL, WorkloadPriority(1000, "WorkloadPriorityClass", "kueue.x-k8s.io", "rl-high")
    )
    assert w["metadata"]["name"] == "rljob-llama" and w["metadata"]["namespace"] == "team-a"
    owner = w["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "RLJob" and owner["uid"] == "u-1" and owner["controller"] is True
    assert w["spec"]["queueName"] == "rl" and w["spec"]["priority"] == 1000
    assert w["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "rl-high",
    }
    assert "priority" not in workload(job(), "rl", URL)["spec"]


def test_queue_state_reads_pending_admitted_evicted_and_finished() -> None:
    assert queue_state("rl", None).phase is QueuePhase.Pending
    pending = queue_state(
        "rl", wl(cond("QuotaReserved", "False", "Pending", "insufficient quota for nvidia.com/gpu"))
    )
    assert (pending.phase, pending.message) == (QueuePhase.Pending, "insufficient quota for nvidia.com/gpu")
    admitted = queue_state(
        "rl",
        wl(cond("QuotaReserved", "True"), cond("Admitted", "True", "Admitted", "ok"), admission=ADMISSION),
    )
    assert admitted.admitted and admitted.flavors == {"engines": ("gpu-nodes",), "executor": ("cpu-nodes",)}
    assert admitted.counts == {"engines": 4, "executor": 1}
    evicted = queue_state(
        "rl",
        wl(cond("Admitted", "True"), cond("Evicted", "True", "Preempted", "by rl-high"), admission=ADMISSION),
    )
    assert (evicted.phase, evicted.reason, evicted.has_admission) == (QueuePhase.Evicted, "Preempted", True)
    assert queue_state("rl", wl(cond("Finished", "True", "Succeeded"))).phase is QueuePhase.Finished
    released = queue_state(
        "rl", wl(cond("Evicted", "True", "Preempted"), cond("QuotaReserved", "False", "Pending", "x"))
    )
    assert released.phase is QueuePhase.Pending  # admission handed back: queued again


def test_quota_is_released_as_kueue_jobframework_does_after_a_preemption() -> None:
    w = wl(
        cond("QuotaReserved", "True", "QuotaReserved"),
        cond("Admitted", "True", "Admitted"),
        cond("Evicted", "True", "Preempted", "Preempted to accommodate a higher priority Workload"),
        admission=ADMISSION,
    )
    patch = release_quota_patch(w, NOW)
    assert patch["metadata"] == {"resourceVersion": "42"} and patch["status"]["admission"] is None
    by_type = {c["type"]: c for c in patch["status"]["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False" and by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["Admitted"]["status"] == "False"
    assert by_type["Requeued"]["status"] == "True" and by_type["Requeued"]["reason"] == "Preempted"
    assert by_type["Evicted"] == w["status"]["conditions"][2]  # Kueue's own condition is left alone
    assert by_type["QuotaReserved"]["lastTransitionTime"] == NOW


def test_finished_patch_sets_finished_true() -> None:
    patch = finished_patch(wl(cond("Admitted", "True")), True, "the RLJob succeeded", NOW)
    finished = next(c for c in patch["status"]["conditions"] if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")
    failed = finished_patch(wl(), False, "x", NOW)["status"]["conditions"][0]
    assert failed["reason"] == "Failed"


def test_flavor_placement_adds_labels_and_tolerations_once() -> None:
    gpu = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    own = Placement(node_selector={"nvidia.com/gpu.product": "H100"}, tolerations=[gpu])
    flavor = FlavorPlacement.of(
        {
            "spec": {
                "nodeLabels": {"pool": "gpu"},
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "spot", "operator": "Exists"},
                ],
            }
        }
    )
    placed = placement_with(own, [flavor])
    assert placed.node_selector == {"nvidia.com/gpu.product": "H100", "pool": "gpu"}
    assert [t.key for t in placed.tolerations] == ["nvidia.com/gpu", "spot"]


def test_admitted_spec_suspends_until_admitted_then_places_engines_and_trainer() -> None:
    spec = RLJobSpec.model_validate(copy.deepcopy(job()["spec"]))
    assert admitted_spec(spec, QueueSeen()) == spec  # no queue label: untouched
    pending = QueueSeen(queue_state("rl", None))
    assert admitted_spec(spec, pending).suspend is True and pending.holds
    state = queue_state("rl", wl(cond("Admitted", "True"), admission=ADMISSION))
    flavor = FlavorPlacement({"pool": "gpu"})
    placed = admitted_spec(spec, QueueSeen(state, {"engines": (flavor,), "trainer": (flavor,)}))
    assert placed.suspend is False
    assert placed.inference.placement.node_selector["pool"] == "gpu"
    assert placed.trainer.placement.node_selector["pool"] == "gpu"
    assert queue_of(job()) == "rl" and queue_of({"metadata": {}}) is None


def test_the_executor_and_the_rayclusters_pods_are_placed_on_their_pod_sets_flavors() -> None:
    obj = job(replicas=1)
    obj["spec"]["rollout"]["rayCluster"] = {"workers": 2}
    cpu, spot = FlavorPlacement({"pool": "cpu"}), FlavorPlacement({"pool": "spot"})
    state = queue_state("rl", wl(cond("Admitted", "True"), admission=ADMISSION))
    seen = QueueSeen(state, {"engines": (FlavorPlacement({"pool": "gpu"}),), "executor": (cpu,),
                             "ray-head": (cpu,), "ray-workers": (spot,)})
    flavors = unplaced_flavors(seen)
    assert set(flavors) == {"executor", "ray-head", "ray-workers"}
    by_kind = {o["kind"]: o for o in desired_children(obj, URL, flavors)}
    assert by_kind["Deployment"]["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    rc = by_kind["RayCluster"]["spec"]
    assert rc["headGroupSpec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert rc["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] == {"pool": "spot"}
    unplaced = {o["kind"]: o for o in desired_children(obj, URL)}["RayCluster"]["spec"]
    assert "nodeSelector" not in unplaced["headGroupSpec"]["template"]["spec"]


def test_status_shows_kueue_s_reason_while_it_holds_the_job() -> None:
    state = queue_state(
        "rl", wl(cond("QuotaReserved", "False", "Pending", "insufficient quota for nvidia.com/gpu"))
    )
    status, _ = build_status(None, Observed(now=0.0, suspend=True, replicas=2, queue=state))
    assert status["phase"] == "Suspended"
    assert (
        status["queue"]["state"] == "Pending"
        and status["queue"]["name"] == "rl"
        and status["queue"]["flavors"] == []
    )
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Suspended"]["reason"] == "QueuedByKueue"
    assert "insufficient quota" in by_type["Suspended"]["message"]
    assert by_type["Admitted"]["status"] == "False" and "insufficient quota" in by_type["Admitted"]["message"]
    unqueued, _ = build_status(None, Observed(now=0.0, suspend=True, replicas=2))
    assert "queue" not in unqueued and "Admitted" not in {c["type"] for c in unqueued["conditions"]}


def test_status_lists_the_flavors_of_an_admission_and_drops_them_with_it() -> None:
    admitted = queue_state("rl", wl(cond("Admitted", "True", "Admitted"), admission=ADMISSION))
    status, _ = build_status(None, Observed(now=0.0, replicas=2, queue=admitted))
    assert status["queue"]["flavors"] == ["engines: gpu-nodes", "executor: cpu-nodes"]
    assert next(c for c in status["conditions"] if c["type"] == "Admitted")["status"] == "True"
    requeued = queue_state(
        "rl", wl(cond("Evicted", "True", "Preempted"), cond("QuotaReserved", "False", "Pending"))
    )
    later, _ = build_status(status, Observed(now=1.0, suspend=True, replicas=2, queue=requeued))
    assert later["queue"]["flavors"] == []  # a list: the merge patch replaces it whole


class KueueKube(FakeKube):
    """FakeKube plus the objects Kueue's side needs (Workloads, flavors), merged like the API server."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    async def get_object(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, name)))

    async def create_object(self, obj: Any) -> dict[str, Any] | None:
        key = (obj["kind"], obj["metadata"]["name"])
        if key in self.objects:
            return None
        self.objects[key] = {**copy.deepcopy(obj), "status": {}}
        return copy.deepcopy(self.objects[key])

    async def delete_object(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.objects.pop((kind, name), None)

    async def patch_object_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Any
    ) -> Any:
        status = self.objects[(kind, name)]["status"]
        for k, v in patch["status"].items():
            if v is None:
                status.pop(k, None)
            else:
                status[k] = copy.deepcopy(v)
        return copy.deepcopy(self.objects[(kind, name)])


def queued_runtime(body: dict[str, Any]) -> tuple[JobRuntime, KueueKube, FakePlatform]:
    """A JobRuntime of `body` (labelled for LocalQueue rl) on the fake ports plus a Kueue-aware FakeKube."""
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "rl"}
    platform = FakePlatform()
    kube = KueueKube(body)
    kube.platform = platform
    rt = JobRuntime(
        body=body,
        kube=kube,
        platform=platform,
        registry=JobRegistry(),
        metrics=Metrics(),
        controller_url="http://op:8080",
        resync_seconds=5,
        clock=FakeClock(),
        engines=FakeEngines(),
    )
    return rt, kube, platform


async def test_a_queued_job_waits_runs_on_its_flavors_stops_when_evicted_and_hands_the_quota_back() -> None:
    body = rljob(2)
    rt, kube, platform = queued_runtime(body)
    rt.recorder.start()
    await settle(rt)
    wl_obj = kube.objects[("Workload", "rljob-job")]
    assert pod_set_counts(wl_obj["spec"]["podSets"]) == {"engines": 2, "executor": 1}
    assert platform.cells == {} and body["status"]["phase"] == "Suspended"
    assert body["status"]["queue"]["state"] == "Pending"

    kube.objects[("ResourceFlavor", "gpu-nodes")] = {"spec": {"nodeLabels": {"pool": "gpu"}}}
    kube.objects[("ResourceFlavor", "cpu-nodes")] = {"spec": {"nodeLabels": {"pool": "cpu"}}}
    wl_obj["status"] = {
        "admission": copy.deepcopy(ADMISSION),
        "conditions": [cond("QuotaReserved", "True"), cond("Admitted", "True", "Admitted")],
    }
    await settle(rt)
    assert len(platform.cells) == 2 and body["status"]["queue"]["state"] == "Admitted"
    assert rt.effective_spec().inference.placement.node_selector == {"pool": "gpu"}
    executor = [o for o in kube.applied if o["kind"] == "Deployment"][-1]
    assert executor["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}

    wl_obj["status"]["conditions"].append(cond("Evicted", "True", "Preempted", "to admit rl-high"))
    await rt.run_pass()
    # The pods go first; the quota is handed back only once none is left.
    assert platform.cells == {} and wl_obj["status"].get("admission") is not None
    for _ in range(10):
        await rt.run_pass()
        if wl_obj["status"].get("admission") is None:
            break
    assert wl_obj["status"].get("admission") is None
    # The pass that hands the quota back already reports it: no stale Evicted until the next pass.
    assert body["status"]["queue"]["state"] == "Pending"
    await settle(rt)
    assert {c["type"]: c["status"] for c in wl_obj["status"]["conditions"]}["QuotaReserved"] == "False"
    assert body["status"]["phase"] == "Suspended" and body["status"]["queue"]["state"] == "Pending"
    assert "QuotaReleased" in {reason for _, reason, _ in kube.events}

    body["spec"]["inference"]["replicas"] = 1  # a new shape is queued again as a new Workload
    body["metadata"]["generation"] = 2
    await settle(rt)
    assert pod_set_counts(kube.objects[("Workload", "rljob-job")]["spec"]["podSets"])["engines"] == 1
    assert "WorkloadRecreated" in {reason for _, reason, _ in kube.events}


async def test_workload_priority_comes_from_the_kueue_label_else_the_engines_priority_class() -> None:
    body = rljob(1)
    body["spec"]["inference"]["placement"] = {"priorityClassName": "big"}
    rt, kube, _ = queued_runtime(body)
    kube.objects[("PriorityClass", "big")] = {"value": 500}
    kube.objects[("WorkloadPriorityClass", "rl-high")] = {"value": 1000}
    await rt.run_pass()
    spec = kube.objects[("Workload", "rljob-job")]["spec"]
    assert spec["priority"] == 500 and spec["priorityClassRef"]["kind"] == "PriorityClass"
    del kube.objects[("Workload", "rljob-job")]
    body["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "rl-high"
    await rt.run_pass()
    spec = kube.objects[("Workload", "rljob-job")]["spec"]
    assert spec["priority"] == 1000 and spec["priorityClassRef"]["kind"] == "WorkloadPriorityClass"
