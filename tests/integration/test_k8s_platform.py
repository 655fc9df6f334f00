"""KubernetesPlatform and the manifest builders against the real test API server.

kwok simulates the nodes (4 GPU nodes with 8 `nvidia.com/gpu`, tainted; loopback pod IPs),
the real scheduler places the pods, the real controller-manager runs Deployments, Jobs,
EndpointSlices and garbage collection, and the real KubeRay CRD validates RayClusters.
"""

from __future__ import annotations

import asyncio
import importlib.util
import ipaddress
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from rljob_operator import labels as L
from rljob_operator.kube.kubeapi import KubeApi, KubeApiError, load_api_client
from rljob_operator.manifests import (
    cells_headless_service,
    engines_service,
    executor_deployment,
    executor_service,
    ray_cluster,
    trainer_workload,
)
from rljob_operator.platform import KubernetesPlatform

from controller_runtime.ports import CellRequest

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "rljob.yaml"
CONTROLLER_URL = "http://rljob-operator.rljob-system.svc:8443"
T = TypeVar("T")

pytestmark = pytest.mark.cluster


class Fatal(Exception):
    """Raised inside a polled function: stop polling, the state can no longer become right."""


async def eventually(fn: Callable[[], Awaitable[T]], what: str, within: float = 90.0) -> T:
    """Poll the async fn until it returns something truthy (returned) or the deadline passes."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        try:
            last = await fn()
            if last:
                return last
        except Fatal:
            raise
        except Exception as e:  # not there yet
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(0.25)


@pytest.fixture
def rljob_crd(cluster) -> None:
    if not CRD.exists():
        pytest.skip(f"{CRD} not generated yet (python -m rljob_operator.crdgen)")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    cluster.wait_established("rljobs.rljob.io")


@pytest.fixture
def kube(cluster) -> Iterator[KubeApi]:
    """The operator's one Kubernetes access layer, on the test cluster."""
    api = KubeApi(load_api_client(str(cluster.kubeconfig)))
    yield api
    api.close()


def rljob_manifest(name: str, namespace: str, **spec_extra: Any) -> dict[str, Any]:
    """The realistic shape: 4 cells x 2 GPUs on 8-GPU nodes, GPU toleration."""
    spec: dict[str, Any] = {
        "model": {"path": "/var/lib/rljob-test/model"},
        "inference": {
            "engine": "vllm",
            "replicas": 4,
            "gpusPerEngine": 2,
            "gpusPerNode": 8,
            "placement": {
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        },
        "rollout": {"dataset": {"path": "/data/prompts.jsonl"}},
        "trainer": {"replicas": 2, "gpusPerReplica": 0},
    }
    spec.update(spec_extra)
    return {
        "apiVersion": "rljob.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def create_rljob(req: KubeApi, obj: dict[str, Any]) -> dict[str, Any]:
    ns = obj["metadata"]["namespace"]
    created = await req.call("POST", f"/apis/rljob.io/v1alpha1/namespaces/{ns}/rljobs", body=obj)
    assert created is not None and created["metadata"]["uid"]
    return created


async def list_items(req: KubeApi, path: str, selector: str | None = None) -> list[dict[str, Any]]:
    query = [("labelSelector", selector)] if selector else []
    result = await req.call("GET", path, query)
    return (result or {}).get("items") or []


def is_loopback(ip: str | None) -> bool:
    return bool(ip) and ipaddress.ip_address(ip) in ipaddress.ip_network("127.0.0.0/8")


async def test_engine_cells_on_gpu_nodes_serve_through_the_engines_service(
    cluster, namespace, rljob_crd, kube
) -> None:
    req = kube
    job = await create_rljob(req, rljob_manifest("llama", namespace))
    platform = KubernetesPlatform(req, namespace, job)
    await platform.apply(cells_headless_service(job))
    await platform.apply(engines_service(job))
    cells = [CellRequest(name=f"llama-cell-{i}", index=i, generation=1) for i in range(4)]

    # Twice, concurrently, as a retried or doubled reconcile would: still one set of pods.
    await asyncio.gather(*(platform.create_cell(c) for c in cells + cells))
    await asyncio.gather(*(platform.create_cell(c) for c in cells))
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    pods = await list_items(req, pods_path, f"{L.JOB}=llama")
    assert sorted(p["metadata"]["name"] for p in pods) == [f"llama-cell-{i}-g1-0" for i in range(4)]

    async def all_running() -> list:
        observed = await platform.observe_cells()
        return observed if len(observed) == 4 and all(c.all_running and c.endpoint for c in observed) else []

    observed = await eventually(all_running, "4 cells Running")
    assert [c.name for c in observed] == [c.name for c in cells]
    for c in observed:
        (pod,) = c.pods
        assert is_loopback(pod.ip), pod.ip
        assert c.endpoint == f"http://{pod.ip}:8000"
        assert pod.node and pod.node.startswith("gpu-"), pod.node
        assert c.generation == 1 and pod.ready

    pods = await list_items(req, pods_path, f"{L.JOB}=llama")
    for p in pods:
        res = p["spec"]["containers"][0]["resources"]
        assert res["requests"]["nvidia.com/gpu"] == "2" and res["limits"]["nvidia.com/gpu"] == "2"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in p["spec"][
            "tolerations"
        ]
        assert p["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]

    ips = {c.name: c.pods[0].ip for c in observed}

    # The Service's endpoints follow the serving label. The API server refuses loopback
    # addresses in EndpointSlices ("may not be in the loopback range"), and every pod IP of
    # the test cluster is loopback, so the EndpointSlice controller cannot publish them here;
    # the check is the selection it computes: the API server's evaluation of the Service's
    # own selector over the pods.
    svc = await req.call("GET", f"/api/v1/namespaces/{namespace}/services/llama-engines")
    assert svc is not None
    selector = L.selector_string(svc["spec"]["selector"])

    async def engine_ips(expected: set[str]) -> set[str]:
        pods = await list_items(req, pods_path, selector)
        got = {p["status"].get("podIP") for p in pods}
        if got != expected:
            raise AssertionError(f"Service selects {sorted(map(str, got))}, expected {sorted(expected)}")
        return got

    await platform.set_serving("llama-cell-0", True)
    await platform.set_serving("llama-cell-2", True)
    await eventually(
        lambda: engine_ips({ips["llama-cell-0"], ips["llama-cell-2"]}), "engines Service selecting cells 0+2"
    )
    await platform.set_serving("llama-cell-0", False)
    await eventually(lambda: engine_ips({ips["llama-cell-2"]}), "engines Service selecting cell 2 only")

    # A recreated cell (new generation) wins; the old generation's pod is cleaned up.
    await platform.create_cell(CellRequest(name="llama-cell-3", index=3, generation=2))
    observed = await platform.observe_cells()
    assert {c.name: c.generation for c in observed}["llama-cell-3"] == 2
    assert platform.last_leftovers == ("llama-cell-3-g1-0",)

    await platform.delete_cell("llama-cell-1")
    await platform.delete_cell("llama-cell-1")  # idempotent

    async def cell1_gone() -> bool:
        names = {p["metadata"]["name"] for p in await list_items(req, pods_path, f"{L.JOB}=llama")}
        return "llama-cell-1-g1-0" not in names and "llama-cell-3-g1-0" not in names

    assert "llama-cell-1" not in {c.name for c in await platform.observe_cells()}
    await eventually(cell1_gone, "pods of cell 1 and of cell 3 generation 1 deleted")


async def test_owned_objects_apply_validate_and_are_garbage_collected(cluster, namespace, rljob_crd, kube) -> None:
    req = kube
    job = await create_rljob(req, rljob_manifest("gc", namespace, rollout={
        "dataset": {"path": "/data/prompts.jsonl"},
        "rayCluster": {"workers": 1},
    }))  # fmt: skip
    platform = KubernetesPlatform(req, namespace, job)

    rc = ray_cluster(job)
    assert rc is not None
    stored_rc = await req.apply(rc)
    assert stored_rc["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    broken = json.loads(json.dumps(rc))
    broken["metadata"]["name"] = "gc-broken"
    del broken["spec"]["workerGroupSpecs"][0]["groupName"]
    with pytest.raises(KubeApiError) as rejected:
        await req.apply(broken)
    assert rejected.value.status == 422  # the real KubeRay CRD's schema refused it

    objects = [
        cells_headless_service(job),
        engines_service(job),
        executor_deployment(job, CONTROLLER_URL),
        executor_service(job),
        *trainer_workload(job, CONTROLLER_URL),
    ]
    stored = [await platform.apply(o) for o in objects]
    # Applying the same objects again changes no spec (controllers still write status, so
    # resourceVersions may move; metadata.generation counts spec changes only).
    again = [await platform.apply(o) for o in objects]
    assert [a["metadata"].get("generation") for a in again] == [
        s["metadata"].get("generation") for s in stored
    ]
    await platform.create_cell(CellRequest(name="gc-cell-0", index=0, generation=1))

    pods_path = f"/api/v1/namespaces/{namespace}/pods"

    async def workload_pods() -> list[dict[str, Any]] | None:
        pods = await list_items(req, pods_path, f"{L.JOB}=gc")
        roles = sorted(p["metadata"]["labels"][L.ROLE] for p in pods)
        return pods if roles == ["engine", "rollout", "trainer", "trainer"] else None

    pods = await eventually(workload_pods, "executor, trainer and engine pods")
    trainers = sorted((p for p in pods if p["metadata"]["labels"][L.ROLE] == "trainer"),
                      key=lambda p: p["metadata"]["annotations"][L.JOB_COMPLETION_INDEX_ANNOTATION])  # fmt: skip
    assert [p["metadata"]["annotations"][L.JOB_COMPLETION_INDEX_ANNOTATION] for p in trainers] == ["0", "1"]
    assert [p["spec"]["hostname"] for p in trainers] == ["gc-trainer-0", "gc-trainer-1"]
    assert all(p["spec"]["subdomain"] == "gc-trainer" for p in trainers)

    await req.call("DELETE", f"/apis/rljob.io/v1alpha1/namespaces/{namespace}/rljobs/gc")

    paths = [
        pods_path,
        f"/api/v1/namespaces/{namespace}/services",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        f"/apis/batch/v1/namespaces/{namespace}/jobs",
        f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters",
    ]

    async def all_collected() -> bool:
        for path in paths:
            if await list_items(req, path, f"{L.JOB}=gc"):
                return False
        return True

    await eventually(all_collected, "garbage collection of everything the RLJob owned", within=120)


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (CPU build) is not installed")
async def test_cpu_engine_pod_runs_a_real_vllm_server(cluster, namespace, rljob_crd, tiny_model_dir, kube) -> None:
    """The engine command as built runs: the process agent starts it behind the pod's loopback IP."""
    req = kube
    manifest = rljob_manifest("cpu", namespace)
    manifest["spec"]["model"] = {"path": str(tiny_model_dir)}
    manifest["spec"]["inference"] = {
        "engine": "vllm",
        "replicas": 1,
        "gpusPerEngine": 0,
        "engineArgs": ["--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager"],
        "env": [
            {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
            # The pod's "image": `python` must be the venv's, whatever PATH the agent inherited.
            {"name": "PATH", "value": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"},
        ],
        "podMetadata": {"labels": {"testcluster.rljob.io/run": "process"}},
    }
    job = await create_rljob(req, manifest)
    platform = KubernetesPlatform(req, namespace, job)
    await platform.create_cell(CellRequest(name="cpu-cell-0", index=0, generation=1))

    async def endpoint() -> str | None:
        (cell,) = await platform.observe_cells()
        if cell.any_failed:
            raise Fatal(f"engine pod failed: {cell.pods}")
        return cell.endpoint

    url = await eventually(endpoint, "cell endpoint")
    assert is_loopback(url.split("//")[1].split(":")[0])

    async def healthy() -> bool:
        (cell,) = await platform.observe_cells()
        if cell.any_failed:  # the process died: the agent failed the pod
            raise Fatal(f"engine pod failed: {cell.pods}")
        status, _ = await asyncio.to_thread(_http, f"{url}/health", None, 5.0)
        return status == 200

    await eventually(healthy, f"vLLM /health at {url}", within=360)
    status, body = await asyncio.to_thread(
        _http,
        f"{url}/v1/completions",
        {"model": str(tiny_model_dir), "prompt": [1, 2, 3], "max_tokens": 2},
        120.0,
    )
    assert status == 200, body[:500]
    assert json.loads(body)["choices"][0]["text"] is not None

    await platform.delete_cell("cpu-cell-0")

    async def gone() -> bool:
        return not await platform.observe_cells() and not await list_items(
            req, f"/api/v1/namespaces/{namespace}/pods", f"{L.JOB}=cpu"
        )

    await eventually(gone, "cell deleted and its process stopped", within=120)
