"""KubernetesPlatform's own logic (grouping, generations, idempotence) over an in-memory pod store.

The store fakes only the REST calls the platform makes; the same behaviours are checked
against a real API server in tests/integration/test_k8s_platform.py.
"""

from __future__ import annotations

import copy
import gc
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from rljob_operator import labels as L
from rljob_operator.kube.kubeapi import KubeApi, KubeApiError, api_error, resource_path
from rljob_operator.platform import KubernetesPlatform, pod_observation
from rljob_operator.pod_cache import EnginePodCache

from controller_runtime.api.spec import RLJobSpec
from controller_runtime.ports import CellRequest

JOBS = Path(__file__).parent / "golden" / "jobs"


class PodStore(KubeApi):
    """Pods by name; answers the platform's GET/POST/DELETE/PATCH on /api/v1/namespaces/ns/pods."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.revision = 0  # etcd's: every write moves it, a LIST answers at the current one

    def _stamp(self, pod: dict[str, Any]) -> None:
        self.revision += 1
        pod["metadata"]["resourceVersion"] = str(self.revision)

    async def call(self, method, path, query=(), body=None, content_type=None, *, ok=()):
        self.calls.append((method, path))
        name = path.rsplit("/pods", 1)[1].lstrip("/") or None
        try:
            return self._handle(method, name, dict(query), body)
        except KubeApiError as e:
            if e.status in ok:
                return None
            raise

    def _handle(self, method, name, query, body):
        if method == "GET":
            sel = dict(kv.split("=") for kv in query["labelSelector"].split(","))
            items = [
                p
                for p in self.pods.values()
                if all(p["metadata"]["labels"].get(k) == v for k, v in sel.items())
            ]
            return {"metadata": {"resourceVersion": str(self.revision)}, "items": copy.deepcopy(items)}
        if method == "POST":
            if body["metadata"]["name"] in self.pods:
                raise api_error("POST", 409, "AlreadyExists")
            pod = copy.deepcopy(body)
            pod["status"] = {"phase": "Pending"}
            self._stamp(pod)
            self.pods[pod["metadata"]["name"]] = pod
            return pod
        if name not in self.pods:
            raise api_error(method, 404, "NotFound")
        if method == "DELETE":
            del self.pods[name]
            self.revision += 1
            return {}
        if method == "PATCH":
            self.pods[name]["metadata"]["labels"].update(body["metadata"]["labels"])
            self._stamp(self.pods[name])
            return self.pods[name]
        raise AssertionError(method)

    def run(self, name: str, ip: str, ready: bool = True) -> None:
        self.pods[name]["status"] = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "engine", "restartCount": 0, "state": {"running": {}}}],
        }
        self.pods[name]["spec"]["nodeName"] = "gpu-0"
        self._stamp(self.pods[name])

    def lists(self) -> int:
        return sum(1 for method, path in self.calls if method == "GET" and path.endswith("/pods"))


def load(case: str) -> dict[str, Any]:
    return yaml.safe_load((JOBS / f"{case}.yaml").read_text())


def platform(case: str = "gpu-4x2") -> tuple[KubernetesPlatform, PodStore]:
    store = PodStore()
    return KubernetesPlatform(store, "rl", load(case)), store


def req(index: int, generation: int = 1, job: str = "llama-8b") -> CellRequest:
    return CellRequest(name=f"{job}-cell-{index}", index=index, generation=generation)


async def test_creating_a_cell_twice_leaves_one_set_of_pods() -> None:
    p, store = platform("multinode-vllm")
    await p.create_cell(req(0, job="llama-70b"))
    await p.create_cell(req(0, job="llama-70b"))
    assert sorted(store.pods) == ["llama-70b-cell-0-g1-0", "llama-70b-cell-0-g1-1"]


async def test_observe_groups_pods_by_cell_and_reports_head_endpoint() -> None:
    p, store = platform("multinode-vllm")
    await p.create_cell(req(1, job="llama-70b"))
    store.run("llama-70b-cell-1-g1-0", "127.10.0.5")
    store.run("llama-70b-cell-1-g1-1", "127.10.1.5", ready=False)
    (cell,) = await p.observe_cells()
    assert (cell.name, cell.index, cell.generation) == ("llama-70b-cell-1", 1, 1)
    assert cell.endpoint == "http://127.10.0.5:8000"
    assert cell.all_running and not cell.any_failed
    assert [pod.ready for pod in cell.pods] == [True, False]
    assert cell.pods[0].node == "gpu-0"


async def test_newest_generation_wins_and_older_leftovers_are_deleted() -> None:
    p, store = platform()
    await p.create_cell(req(0, generation=1))
    await p.create_cell(req(0, generation=2))
    (cell,) = await p.observe_cells()
    assert cell.generation == 2
    assert p.last_leftovers == ("llama-8b-cell-0-g1-0",)
    assert sorted(store.pods) == ["llama-8b-cell-0-g2-0"]


async def test_a_missing_pod_makes_the_cell_look_failed_not_smaller() -> None:
    p, store = platform("multinode-vllm")
    await p.create_cell(req(0, job="llama-70b"))
    store.run("llama-70b-cell-0-g1-0", "127.10.0.5")
    del store.pods["llama-70b-cell-0-g1-1"]
    (cell,) = await p.observe_cells()
    assert len(cell.pods) == 2
    assert cell.pods[1].phase == "Unknown" and cell.any_failed


async def test_a_wholly_terminating_cell_is_absent_a_partly_terminating_one_failed() -> None:
    p, store = platform("multinode-vllm")
    await p.create_cell(req(0, job="llama-70b"))
    await p.create_cell(req(1, job="llama-70b"))
    for name in ("llama-70b-cell-0-g1-0", "llama-70b-cell-0-g1-1", "llama-70b-cell-1-g1-1"):
        store.pods[name]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cells = await p.observe_cells()
    assert [c.name for c in cells] == ["llama-70b-cell-1"]
    assert cells[0].any_failed and cells[0].pods[1].message == "Terminating"


async def test_delete_cell_removes_every_generation_and_tolerates_absence() -> None:
    p, store = platform()
    await p.create_cell(req(0, generation=1))
    await p.create_cell(req(0, generation=2))
    await p.create_cell(req(1))
    await p.delete_cell("llama-8b-cell-0")
    await p.delete_cell("llama-8b-cell-0")
    assert sorted(store.pods) == ["llama-8b-cell-1-g1-0"]


async def test_set_serving_flips_the_label_on_the_cells_pods_only() -> None:
    p, store = platform()
    await p.create_cell(req(0))
    await p.create_cell(req(1))
    await p.set_serving("llama-8b-cell-0", True)
    assert store.pods["llama-8b-cell-0-g1-0"]["metadata"]["labels"][L.SERVING] == "true"
    assert store.pods["llama-8b-cell-1-g1-0"]["metadata"]["labels"][L.SERVING] == "false"
    await p.set_serving("llama-8b-cell-0", False)
    assert store.pods["llama-8b-cell-0-g1-0"]["metadata"]["labels"][L.SERVING] == "false"


async def test_other_api_errors_are_raised_as_platform_errors() -> None:
    p, store = platform()

    async def refuse(*args, **kwargs):
        raise api_error("POST pods", 403, "Forbidden")

    store.call = refuse  # type: ignore[method-assign]
    with pytest.raises(KubeApiError) as info:
        await p.create_cell(req(0))
    assert info.value.status == 403


def test_pod_observation_reads_phase_ip_readiness_restarts_and_reason() -> None:
    pod = {
        "metadata": {"name": "x"},
        "spec": {"nodeName": "gpu-1"},
        "status": {
            "phase": "Running",
            "podIP": "127.10.1.7",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
        },
    }
    obs = pod_observation(pod)
    assert (obs.phase, obs.ip, obs.ready, obs.restarts, obs.node) == (
        "Running",
        "127.10.1.7",
        True,
        2,
        "gpu-1",
    )
    assert obs.message == "CrashLoopBackOff"
    unschedulable = {
        "metadata": {"name": "y"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/6 nodes"}
            ],
        },
    }
    assert pod_observation(unschedulable).message == "Unschedulable: 0/6 nodes"


def test_resource_paths_for_core_and_group_kinds() -> None:
    assert resource_path("v1", "Service", "ns", "s") == "/api/v1/namespaces/ns/services/s"
    assert resource_path("batch/v1", "Job", "ns") == "/apis/batch/v1/namespaces/ns/jobs"
    assert (
        resource_path("ray.io/v1", "RayCluster", "ns", "r") == "/apis/ray.io/v1/namespaces/ns/rayclusters/r"
    )


async def test_engine_pods_without_cell_labels_are_ignored() -> None:
    p, store = platform()
    await p.create_cell(req(0))
    stray = copy.deepcopy(store.pods["llama-8b-cell-0-g1-0"])
    stray["metadata"]["name"] = "stray"
    del stray["metadata"]["labels"][L.GENERATION]
    store.pods["stray"] = stray
    assert [c.name for c in await p.observe_cells()] == ["llama-8b-cell-0"]
    assert "stray" in store.pods


def test_api_errors_form_one_tree_keyed_by_status() -> None:
    from rljob_operator.kube.kubeapi import Conflict, Invalid, NotFound

    assert [type(api_error("GET x", s, "r")) for s in (404, 409, 422, 500, 0)] == [
        NotFound, Conflict, Invalid, KubeApiError, KubeApiError,
    ]
    e = api_error("PATCH /apis/batch/v1/namespaces/ns/jobs/t", 422, "Unprocessable Entity", '{"message": "field is immutable"}')
    assert isinstance(e, KubeApiError) and e.status == 422
    assert str(e) == "PATCH /apis/batch/v1/namespaces/ns/jobs/t: HTTP 422: field is immutable"


async def test_set_serving_patches_the_pods_the_last_observe_saw_without_listing_again() -> None:
    """An offload relabels every cell at once; a list per cell was one API round trip more each."""
    p, store = platform()
    await p.create_cell(req(0))
    store.run("llama-8b-cell-0-g1-0", "127.10.0.5")
    await p.observe_cells()
    store.calls.clear()
    await p.set_serving("llama-8b-cell-0", True)
    assert store.calls == [("PATCH", "/api/v1/namespaces/rl/pods/llama-8b-cell-0-g1-0")]
    assert store.pods["llama-8b-cell-0-g1-0"]["metadata"]["labels"][L.SERVING] == "true"


async def test_set_serving_of_a_multi_node_cell_is_one_patch_of_its_head() -> None:
    """Only the head of a cell serves HTTP and the Service selects heads alone; a label PATCH on
    every pod of the cell was 800 of the ~2,600 writes of a 100-job ramp (issue 13)."""
    p, store = platform("multinode-vllm")
    await p.create_cell(req(0, job="llama-70b"))
    assert L.SERVING not in store.pods["llama-70b-cell-0-g1-1"]["metadata"]["labels"]
    for name in ("llama-70b-cell-0-g1-0", "llama-70b-cell-0-g1-1"):
        store.run(name, "127.10.0.5")
    await p.observe_cells()
    store.calls.clear()
    await p.set_serving("llama-70b-cell-0", True)
    assert store.calls == [("PATCH", "/api/v1/namespaces/rl/pods/llama-70b-cell-0-g1-0")]
    await p.create_cell(req(1, job="llama-70b"))
    store.calls.clear()
    await p.set_serving("llama-70b-cell-1", True)  # not observed yet: one list, of the head alone
    assert [m for m, _ in store.calls] == ["GET", "PATCH"]
    assert store.pods["llama-70b-cell-1-g1-0"]["metadata"]["labels"][L.SERVING] == "true"
    assert L.SERVING not in store.pods["llama-70b-cell-1-g1-1"]["metadata"]["labels"]


async def test_set_serving_after_a_recreation_labels_the_new_pods_not_the_observed_ones() -> None:
    p, store = platform()
    await p.create_cell(req(0))
    store.run("llama-8b-cell-0-g1-0", "127.10.0.5")
    await p.observe_cells()
    await p.delete_cell("llama-8b-cell-0")
    await p.create_cell(req(0, generation=2))
    await p.set_serving("llama-8b-cell-0", True)
    assert store.pods["llama-8b-cell-0-g2-0"]["metadata"]["labels"][L.SERVING] == "true"


# -- the shared engine-pod cache (the operator's pod watch) -------------------------------------
def watched(case: str = "gpu-4x2") -> tuple[KubernetesPlatform, PodStore, EnginePodCache, list[float]]:
    store, cache, clock = PodStore(), EnginePodCache(), [0.0]
    return KubernetesPlatform(store, "rl", load(case), cache, now=lambda: clock[0]), store, cache, clock


def deliver(store: PodStore, cache: EnginePodCache, *names: str) -> None:
    """The watch delivers the named pods as stored now (all of them when none is named)."""
    for name in names or tuple(store.pods):
        pod = copy.deepcopy(store.pods[name])
        pod["metadata"]["namespace"] = "rl"
        cache.record("MODIFIED", pod)


async def test_a_steady_job_reads_its_pods_from_the_watch_not_a_list_per_pass() -> None:
    p, store, cache, _ = watched()
    for i in range(4):
        await p.create_cell(req(i))
        store.run(f"llama-8b-cell-{i}-g1-0", f"127.10.0.{i + 1}")
    first = await p.observe_cells()
    deliver(store, cache)
    lists = store.lists()
    for _ in range(5):
        assert await p.observe_cells() == first
    assert store.lists() == lists  # five passes, no LIST


async def test_a_pod_the_watch_lacks_is_asked_of_the_api_server_never_taken_as_gone() -> None:
    p, store, cache, _ = watched()
    await p.create_cell(req(0))
    store.run("llama-8b-cell-0-g1-0", "127.10.0.1")
    await p.observe_cells()
    deliver(store, cache)
    await p.create_cell(req(1))  # the watch has not delivered cell 1's pod yet
    lists = store.lists()
    cells = await p.observe_cells()
    assert [c.name for c in cells] == ["llama-8b-cell-0", "llama-8b-cell-1"]
    assert store.lists() == lists + 1
    cache.record("DELETED", {"metadata": {"name": "llama-8b-cell-0-g1-0", "namespace": "rl",
                                          "labels": {L.JOB: "llama-8b"}, "resourceVersion": "999"}})
    deliver(store, cache, "llama-8b-cell-1-g1-0")
    cells = await p.observe_cells()  # the watch says cell 0's pod is gone; the API server still has it
    assert [c.name for c in cells] == ["llama-8b-cell-0", "llama-8b-cell-1"]
    assert cells[0].endpoint == "http://127.10.0.1:8000"
    assert store.lists() == lists + 2


async def test_a_late_watch_event_older_than_a_list_never_rolls_the_view_back() -> None:
    p, store, cache, _ = watched()
    await p.create_cell(req(0))
    pending = copy.deepcopy(store.pods["llama-8b-cell-0-g1-0"])
    store.run("llama-8b-cell-0-g1-0", "127.10.0.1")
    (cell,) = await p.observe_cells()  # a LIST (the watch had nothing): running
    assert cell.all_running
    pending["metadata"]["namespace"] = "rl"
    cache.record("ADDED", pending)  # the watch's event of the created pod arrives late
    lists = store.lists()
    (cell,) = await p.observe_cells()
    assert cell.all_running and store.lists() == lists


async def test_pods_this_platform_deleted_are_not_seen_again_from_a_lagging_watch() -> None:
    p, store, cache, _ = watched()
    await p.create_cell(req(0, generation=1))
    await p.observe_cells()
    deliver(store, cache)
    await p.delete_cell("llama-8b-cell-0")
    lists = store.lists()
    assert await p.observe_cells() == []  # the watch still shows the pod; it was deleted here
    assert store.lists() == lists


async def test_the_watch_is_checked_against_a_list_every_relist_period() -> None:
    p, store, cache, clock = watched()
    await p.create_cell(req(0))
    await p.observe_cells()
    deliver(store, cache)
    lists = store.lists()
    await p.observe_cells()
    assert store.lists() == lists
    clock[0] += p.relist_seconds
    await p.observe_cells()
    assert store.lists() == lists + 1


def test_the_cache_keeps_the_newest_copy_and_a_list_drops_what_the_watch_missed() -> None:
    cache = EnginePodCache()

    def pod(name: str, rv: int, phase: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "rl", "labels": {L.JOB: "j"}, "resourceVersion": str(rv)},
                "spec": {"containers": [{"name": "engine"}]}, "status": {"phase": phase}}  # fmt: skip

    cache.record(None, pod("a", 5, "Running"))
    cache.record("MODIFIED", pod("a", 3, "Pending"))  # late: older than held
    cache.record("ADDED", pod("b", 6, "Pending"))
    assert {p["metadata"]["name"]: p["status"]["phase"] for p in cache.pods("rl", "j")} == {"a": "Running", "b": "Pending"}
    assert "containers" not in cache.pods("rl", "j")[0]["spec"]  # slim: the spec is not kept
    cache.record("ADDED", pod("c", 9, "Pending"))
    cache.replace("rl", "j", [pod("b", 6, "Pending")], 8)  # "a" went in a watch gap; "c" is newer than the list
    assert sorted(p["metadata"]["name"] for p in cache.pods("rl", "j")) == ["b", "c"]
    cache.record("DELETED", pod("b", 10, "Pending"))
    cache.record("DELETED", pod("c", 11, "Pending"))
    assert cache.pods("rl", "j") == [] and len(cache) == 0


def kubelet_pod(name: str, status: dict[str, Any]) -> dict[str, Any]:
    """An engine pod as the watch delivers it: the spec, our annotations and a user's, a status."""
    return {
        "metadata": {"name": name, "namespace": "rl", "resourceVersion": "7", "uid": "u",
                     "labels": {L.JOB: "j", L.CELL: "j-cell-0", L.GENERATION: "1", L.CELL_INDEX: "0", L.POD_INDEX: "0"},
                     "annotations": {L.CELL_NAME_ANNOTATION: "j-cell-0", "example.com/team": "post-training"},
                     "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]},
        "spec": {"nodeName": "gpu-0", "containers": [{"name": "engine", "image": "vllm"}]},
        "status": status,
    }  # fmt: skip


T = "2026-12-01T00:00:05Z"
KUBELET_STATUSES = {
    "running": {
        "phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}], "hostIP": "10.1.0.1",
        "qosClass": "Burstable", "startTime": T,
        "conditions": [{"type": c, "status": "True", "lastTransitionTime": T, "lastProbeTime": None}
                       for c in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
        "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 2, "image": "vllm",
                               "imageID": "sha256:ab", "containerID": "containerd://cd", "started": True,
                               "state": {"running": {"startedAt": T}},
                               "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}],
    },
    "crashlooping": {
        "phase": "Running", "podIP": "10.0.0.6",
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "not ready"}],
        "containerStatuses": [{"name": "engine", "restartCount": 5, "image": "vllm",
                               "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}}}],
    },
    "unschedulable": {
        "phase": "Pending", "qosClass": "Burstable",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", "lastTransitionTime": T}],
    },
    "evicted": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
    "terminated": {
        "phase": "Failed", "podIP": "10.0.0.7",
        "containerStatuses": [{"name": "engine", "restartCount": 0,
                               "state": {"terminated": {"reason": "Error", "message": "exit 1", "exitCode": 1}}}],
    },
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(KUBELET_STATUSES))
def test_the_cache_keeps_only_what_the_platform_reads_and_reads_the_same(case: str) -> None:
    """A cached pod observes exactly as the full pod does, while keeping none of the kubelet's
    other status fields, the pod spec, managedFields or user annotations (bench/job_memory.py:
    a kubelet's status was 4.9 of a cached running pod's 6.6 KB)."""
    full = kubelet_pod("j-cell-0-g1-0", copy.deepcopy(KUBELET_STATUSES[case]))
    cache = EnginePodCache()
    cache.record("MODIFIED", full)
    (slim,) = cache.pods("rl", "j")
    assert pod_observation(slim) == pod_observation(full)
    assert slim["metadata"]["annotations"] == {L.CELL_NAME_ANNOTATION: "j-cell-0"}
    assert "managedFields" not in slim["metadata"] and slim["spec"] == {"nodeName": "gpu-0"}
    assert set(slim["status"]) <= {"phase", "podIP", "reason", "message", "conditions", "containerStatuses"}
    for cond in slim["status"].get("conditions", []):
        assert cond["type"] in ("Ready", "PodScheduled") and set(cond) <= {"type", "status", "reason", "message"}
    for cs in slim["status"].get("containerStatuses", []):
        assert set(cs) <= {"restartCount", "state"} and set(cs.get("state", {})) <= {"waiting", "terminated"}


def _reachable(root: object, skip: tuple[object, ...]) -> list[object]:
    seen, stack, out = {id(s) for s in skip}, [root], []
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, type):
            continue
        seen.add(id(o))
        out.append(o)
        stack.extend(gc.get_referents(o))
    return out


async def test_a_platform_keeps_its_spec_compact_not_a_validated_one() -> None:
    """A validated RLJobSpec (25 pydantic models) was 23 KB per job for good (bench/job_memory.py);
    the platform keeps the spec's non-default fields, validates them when a cell is made, and
    an in-place change of the caller's body does not reach the cells it builds."""
    body = load("gpu-4x2")
    store = PodStore()
    p = KubernetesPlatform(store, "rl", body)
    assert not [o for o in _reachable(p, (store,)) if isinstance(o, RLJobSpec)]
    body["spec"]["inference"]["engineArgs"] = ["--changed"]  # not an update_job: cells keep the old spec
    await p.create_cell(req(0))
    pod = store.pods["llama-8b-cell-0-g1-0"]
    assert "--changed" not in json.dumps(pod["spec"]) and "--max-model-len" in json.dumps(pod["spec"])
    assert p.job.spec == RLJobSpec.model_validate(load("gpu-4x2")["spec"])
    edited = load("gpu-4x2")
    edited["spec"]["inference"]["replicas"] = 6
    p.update_job({"metadata": edited["metadata"], "spec": RLJobSpec.model_validate(edited["spec"])})  # the runtime's
    assert not [o for o in _reachable(p, (store,)) if isinstance(o, RLJobSpec)]
    assert p.job.spec == RLJobSpec.model_validate(edited["spec"])


def test_a_platform_refuses_a_spec_that_does_not_validate_at_once() -> None:
    body = load("gpu-4x2")
    body["spec"]["inference"]["replicas"] = "many"
    with pytest.raises(ValidationError):
        KubernetesPlatform(PodStore(), "rl", body)


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_a_compact_spec_validates_back_to_the_same_spec(path: Path) -> None:
    """What the platform keeps (non-default fields) is the spec: it is not checked again at run time."""
    spec = RLJobSpec.model_validate(yaml.safe_load(path.read_text())["spec"])
    compact = spec.model_dump(by_alias=True, exclude_defaults=True, mode="json")
    assert RLJobSpec.model_validate(compact) == spec


async def test_the_spec_is_validated_once_on_its_way_to_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """It went validate -> dump -> validate (a round-trip check) -> validate (the cell's build)."""
    body = load("gpu-4x2")
    spec = RLJobSpec.model_validate(body["spec"])
    validations: list[object] = []
    validate = RLJobSpec.model_validate.__func__  # type: ignore[attr-defined]

    def counted(cls: type[RLJobSpec], obj: object, **kw: Any) -> RLJobSpec:
        validations.append(obj)
        return validate(cls, obj, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(RLJobSpec, "model_validate", classmethod(counted))
    store = PodStore()
    p = KubernetesPlatform(store, "rl", {"metadata": body["metadata"], "spec": spec})  # as the runtime hands it
    assert validations == [], "a validated spec is kept without validating it again"
    await p.create_cell(req(0))
    assert len(validations) == 1 and store.pods, "one validation per cell built"
