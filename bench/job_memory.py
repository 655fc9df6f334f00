"""What one RLJob costs the operator in memory, measured in one process (no cluster).

Builds N `JobRuntime`s the way `handlers.run_rljob` does (a real `KubernetesPlatform` over the
process's one `EnginePodCache`, one `Metrics`, one `JobRegistry`, real engine clients on one
aiohttp session), against an in-memory API server, and runs passes until every job's 4 cells x
2 pods are Serving. A fake kubelet marks each created pod Running with the status a kubelet
writes (conditions, container statuses) and delivers it to the pod cache as the operator's pod watch
would; the RLJob bodies carry managedFields and finalizers as kopf's watch hands them over.

tracemalloc is started before the first job: the per-job figure is (heap with N jobs - heap with
the warm-up jobs) / (N - warm-up), minus what the fake API server itself holds (its stored
objects, kept as JSON strings so that their size is plain to count). The top allocators are
grouped by the innermost frame inside this repository's code.

    .venv/bin/python bench/job_memory.py [--jobs 200] [--top 25]

prints a JSON report, then a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import linecache
import os
import sys
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from rljob_operator.kube.kubeapi import KubeApi, KubeApiError, api_error
from rljob_operator.metrics import Metrics
from rljob_operator.platform import KubernetesPlatform
from rljob_operator.pod_cache import EnginePodCache
from rljob_operator.reconcile.engines import TimedEngineClient
from rljob_operator.reconcile.job_runtime import JobRuntime
from rljob_operator.registry import JobRegistry

from controller_runtime.clients.factory import make_engine_client
from controller_runtime.clock import FakeClock

ROOT = Path(__file__).resolve().parent.parent


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def job_body(i: int) -> dict[str, Any]:
    """An RLJob as kopf's watch delivers it (4 vLLM cells x 2 pods, like tests' gpu-4x2 golden)."""
    name = f"job-{i:04d}"
    spec = {
        "model": {"pvc": {"claimName": "models", "subPath": "meta-llama/Llama-3.1-8B-Instruct"}},
        "inference": {
            "engine": "vllm", "replicas": 4, "gpusPerEngine": 16, "gpusPerNode": 8,
            "engineArgs": ["--max-model-len", "4096", "--gpu-memory-utilization", "0.85"],
            "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "64Gi"}},
            "placement": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                          "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        },
        "rollout": {"dataset": {"path": "/models/datasets/gsm8k-train.jsonl"},
                    "reward": {"function": "rollout_executor.rewards:math_answer"}, "batchSize": 32},
        "trainer": {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": f"{name}-trainer"}},
    }
    return {
        "apiVersion": "rljob.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {
            "name": name, "namespace": "rl", "uid": f"00000000-0000-4000-8000-{i:012d}", "generation": 1,
            "resourceVersion": "1", "creationTimestamp": "2026-12-01T00:00:00Z",
            "finalizers": ["rljob.io/operator"],
            "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update",
                               "apiVersion": "rljob.io/v1alpha1", "time": "2026-12-01T00:00:00Z",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:inference": {}, "f:model": {}}}}],
        },
        "spec": spec,
    }


def kubelet_status(pod: dict[str, Any], ip: str) -> dict[str, Any]:
    """The status a kubelet writes for a running single-container pod."""
    t = "2026-12-01T00:00:05Z"
    cid = "containerd://" + "ab" * 32
    return {
        "phase": "Running", "hostIP": "10.0.0.7", "hostIPs": [{"ip": "10.0.0.7"}], "podIP": ip,
        "podIPs": [{"ip": ip}], "qosClass": "Burstable", "startTime": t,
        "conditions": [
            {"type": c, "status": "True", "lastProbeTime": None, "lastTransitionTime": t}
            for c in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "containerStatuses": [{
            "name": c["name"], "ready": True, "restartCount": 0, "started": True,
            "image": c.get("image", "vllm/vllm-openai:v0.32.0"),
            "imageID": "docker.io/vllm/vllm-openai@sha256:" + "cd" * 32, "containerID": cid,
            "state": {"running": {"startedAt": t}}, "lastState": {},
            "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
        } for c in (pod.get("spec") or {}).get("containers") or [{"name": "engine"}]],
    }


class FakeApiServer(KubeApi):
    """Objects by REST path, stored as JSON text (what an API server holds is not the operator's
    memory: `held_bytes` is subtracted); answers are fresh objects, as the real client's are."""

    def __init__(self, pods: EnginePodCache) -> None:
        self.objects: dict[str, str] = {}
        self.cache = pods
        self.revision = 0
        self.pending: list[str] = []  # pod paths the kubelet has not started yet

    def held_bytes(self) -> int:
        return sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in self.objects.items()) + sys.getsizeof(self.objects)

    def _put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.revision += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.revision)
        self.objects[path] = json.dumps(obj)
        return obj

    async def call(self, method: str, path: str, query: Sequence[tuple[str, str]] = (), body: Any = None,
                   content_type: str | None = None, *, ok: tuple[int, ...] = ()) -> dict[str, Any] | None:
        try:
            return self._handle(method, path, dict(query), body)
        except KubeApiError as e:
            if e.status in ok:
                return None
            raise

    def _handle(self, method: str, path: str, query: dict[str, str], body: Any) -> dict[str, Any] | None:
        status_sub = path.endswith("/status")
        obj_path = path[: -len("/status")] if status_sub else path
        if method == "GET" and "labelSelector" in query:
            sel = dict(kv.split("=", 1) for kv in query["labelSelector"].split(","))
            items = [o for p, s in self.objects.items() if p.startswith(path + "/")
                     for o in [json.loads(s)] if all((o["metadata"].get("labels") or {}).get(k) == v
                                                     for k, v in sel.items())]
            return {"metadata": {"resourceVersion": str(self.revision)}, "items": items}
        if method == "GET":
            if obj_path not in self.objects:
                raise api_error(path, 404, "NotFound")
            return json.loads(self.objects[obj_path])
        if method == "POST":
            if path.endswith("/events"):
                return {}
            obj = copy.deepcopy(body)
            where = f"{path}/{obj['metadata']['name']}"
            if where in self.objects:
                raise api_error(path, 409, "AlreadyExists")
            if path.endswith("/pods"):
                obj["status"] = {"phase": "Pending"}
                self.pending.append(where)
            return self._put(where, obj)
        if method == "DELETE":
            if self.objects.pop(obj_path, None) is None:
                raise api_error(path, 404, "NotFound")
            return {}
        if method == "PATCH":
            stored = json.loads(self.objects[obj_path]) if obj_path in self.objects else None
            if status_sub or (stored is not None and "labels" in (body.get("metadata") or {}) and len(body) == 1):
                if stored is None:
                    raise api_error(path, 404, "NotFound")
                merge(stored, body)
                out = self._put(obj_path, stored)
                if "/pods/" in obj_path:
                    self.cache.record("MODIFIED", out)
                return out
            return self._put(obj_path, copy.deepcopy(body))  # server-side apply of a whole object
        raise AssertionError(method)

    def run_pods(self) -> None:
        """The kubelet: every pending pod runs, and the pod watch delivers it."""
        for n, path in enumerate(self.pending):
            if path not in self.objects:
                continue
            pod = json.loads(self.objects[path])
            pod["status"] = kubelet_status(pod, f"10.{(self.revision >> 16) & 255}.{(self.revision >> 8) & 255}.{n & 255}")
            pod.setdefault("spec", {})["nodeName"] = "gpu-node-7"
            self.cache.record("MODIFIED", self._put(path, pod))
        self.pending.clear()


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


class HealthyClient(TimedEngineClient):
    """A real vLLM client (as the operator holds one per cell), whose /health always answers."""

    async def health(self) -> None:
        self._observe(0.001)


class Operator:
    """What `main` and `handlers` share across jobs, and each job as `run_rljob` builds it."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.pods = EnginePodCache()
        self.api = FakeApiServer(self.pods)
        self.metrics = Metrics()
        self.registry = JobRegistry()
        self.clock = FakeClock()
        self.session = session
        self.runtimes: dict[str, JobRuntime] = {}
        self.bodies: dict[str, dict[str, Any]] = {}  # kopf's bodies (kopf's memory, not ours)

    def engines(self, job: str) -> Any:
        """The job's engine clients, as `engines.engine_factory` makes them (timed per job)."""
        observe = self.metrics.probe_seconds.labels("rl", job).observe
        return lambda endpoint: HealthyClient(make_engine_client("vllm", endpoint, session=self.session), observe)

    def add(self, i: int) -> JobRuntime:
        body = job_body(i)
        path = f"/apis/rljob.io/v1alpha1/namespaces/rl/rljobs/{body['metadata']['name']}"
        self.api._put(path, copy.deepcopy(body))
        watched = json.loads(self.api.objects[path])  # kopf's copy, from its watch
        rt = JobRuntime(
            body=watched, kube=self.api, platform=KubernetesPlatform(self.api, "rl", dict(watched), self.pods),
            registry=self.registry, metrics=self.metrics, controller_url="http://rljob-operator.op.svc:8080",
            resync_seconds=10.0, clock=self.clock, engines=self.engines(body['metadata']['name']), session=self.session, events=self.api,
        )
        rt.recorder.start()
        self.runtimes[body["metadata"]["name"]] = rt
        self.bodies[body["metadata"]["name"]] = watched
        return rt

    async def converge(self, rts: list[JobRuntime], passes: int = 8) -> None:
        for _ in range(passes):
            for rt in rts:
                await rt.run_pass()
                self.api.run_pods()
                # kopf's watch brings the status write back into its body
                stored = json.loads(self.api.objects[f"/apis/rljob.io/v1alpha1/namespaces/rl/rljobs/{rt.name}"])
                rt.watched["status"] = stored.get("status")  # type: ignore[index]
                rt.watched["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]  # type: ignore[index]
            await self.clock.advance(2.0)
        for rt in rts:
            await rt.recorder.flush()
        not_ready = [rt.name for rt in rts if (rt.stored_status.get("ready") != "4/4")]
        if not_ready:
            raise SystemExit(f"jobs not ready after {passes} passes: {not_ready[:5]} {rts[0].stored_status}")


def ours(frame_file: str) -> bool:
    return frame_file.startswith(str(ROOT)) and "/bench/" not in frame_file and "/.venv/" not in frame_file


def top_allocators(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, jobs: int, top: int) -> list[dict[str, Any]]:
    """Growth by the innermost frame in the operator's code (else the innermost frame at all)."""
    filt = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap*>")]
    grouped: dict[str, int] = {}
    for diff in after.filter_traces(filt).compare_to(before.filter_traces(filt), "traceback"):
        if not diff.size_diff:
            continue
        frames = list(diff.traceback)[::-1]  # most recent first
        frame = next((f for f in frames if ours(f.filename)), frames[0])
        inner = frames[0]
        where = f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno}"
        if frame is not inner:
            where += f" via {Path(inner.filename).name}:{inner.lineno}"
        grouped[where] = grouped.get(where, 0) + diff.size_diff
    rows = sorted(grouped.items(), key=lambda kv: -kv[1])[:top]
    out = []
    for where, size in rows:
        file, _, rest = where.partition(":")
        line = linecache.getline(str(ROOT / file), int(rest.split()[0])).strip() if (ROOT / file).exists() else ""
        out.append({"where": where, "bytes_per_job": round(size / jobs), "code": line[:100]})
    return out


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--frames", type=int, default=16)
    args = ap.parse_args(argv)
    tracemalloc.start(args.frames)
    async with aiohttp.ClientSession() as session:
        op = Operator(session)
        warm = [op.add(i) for i in range(args.warmup)]
        await op.converge(warm)
        gc.collect()
        before, heap0, rss0, held0 = tracemalloc.take_snapshot(), tracemalloc.get_traced_memory()[0], rss_mib(), op.api.held_bytes()
        more = [op.add(i) for i in range(args.warmup, args.warmup + args.jobs)]
        await op.converge(more)
        gc.collect()
        after, heap1, rss1, held1 = tracemalloc.take_snapshot(), tracemalloc.get_traced_memory()[0], rss_mib(), op.api.held_bytes()
        n = args.jobs
        kopf_body = sum(len(json.dumps(b)) for b in op.bodies.values()) / len(op.bodies)
        report = {
            "jobs": n,
            "warmup_jobs": args.warmup,
            "pods_cached": len(op.pods),
            "heap_bytes_per_job": round((heap1 - heap0 - (held1 - held0)) / n),
            "fake_apiserver_bytes_per_job": round((held1 - held0) / n),
            "rss_mib_per_job_incl_tracemalloc": round((rss1 - rss0) / n, 4),
            "kopf_body_json_bytes": round(kopf_body),
            "top_allocators": top_allocators(before, after, n, args.top),
        }
        for rt in op.runtimes.values():
            await rt.recorder.close()
            await rt.fleet.stop()
    return report


if __name__ == "__main__":
    rep = asyncio.run(main())
    print(json.dumps(rep, indent=1))
    print(f"job_memory: {rep['jobs']} jobs, {rep['heap_bytes_per_job']} heap bytes per job "
          f"(tracemalloc, less the fake API server's {rep['fake_apiserver_bytes_per_job']}); "
          f"{rep['pods_cached']} pods cached")
