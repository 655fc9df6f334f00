"""Control calls through the operator's controller API vs the same engine calls made directly.

    .venv/bin/python bench/control_bench.py [--cells 1 4 16] [--iters 30] [--vllm] [--json-out FILE] [--smoke]

The real operator (`rljob-operator`, default TokenReview/SubjectAccessReview cache) against
the test cluster's real kube-apiserver; the bench plays the trainer: the real
`InferenceControllerClient`, authenticated with a ServiceAccount token bound to
`rljobs/control` (as a trainer pod calls it). Engines: the stand-in processes run by the
cluster's agent, one per cell, and with `--vllm` one job of one real vLLM CPU engine (the
tiny model the tests build).

Per verb, `iters` calls after 3 warm-up calls, alternating with the direct path in the same
loop (load from other tenants hits both alike):

  api     the controller API call, client side (auth, the controller's engine calls, the status
          write the operator makes before it answers, the answer)
  direct  the engine calls the controller makes for that verb, made by the bench at once on
          every cell with the same engine client (offload: flush the cache, release memory;
          onload: resume memory); start/end_update_weights and cells make none (the trainer
          pushes weights itself), so their added latency is the whole call

Added latency = api - direct per paired call; p50/p99 reported. Target: p50 added <= 20 ms for
the 16-cell window (start + end). Prints one JSON object, then a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the cluster and operator harnesses live with the tests

from rljob_client.controller_client import InferenceControllerClient  # noqa: E402

from bench.benchcluster import bench_namespace, open_cluster  # noqa: E402
from controller_runtime.api.spec import MemoryTag  # noqa: E402
from controller_runtime.clients.factory import make_engine_client  # noqa: E402
from tests.cluster.fixtures import Cluster  # noqa: E402
from tests.integration.operator_harness import (  # noqa: E402
    Kube,
    OperatorProcess,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

WARMUP = 3
TARGET_ADDED_MS = 20.0
AUTH_CACHE_SECONDS = "10"  # the operator's default (settings.auth_cache_seconds), stated so the harness' 0 is overridden
OFFLOAD_TAGS = [MemoryTag.weights, MemoryTag.kv_cache]


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def stats_ms(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(values) * 1e3, 2), "p99_ms": round(percentile(values, 99) * 1e3, 2),
            "mean_ms": round(statistics.fmean(values) * 1e3, 2)}  # fmt: skip


def grant_control(kube: Kube, jobs: list[str]) -> str:
    """A ServiceAccount `trainer` that may update rljobs/control of `jobs`; its token."""
    kube.cluster.kubectl("create", "serviceaccount", "trainer", "-n", kube.ns, check=False)
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "rljob-control", "namespace": kube.ns},
                "rules": [{"apiGroups": ["rljob.io"], "resources": ["rljobs/control"], "verbs": ["update"],
                           "resourceNames": jobs}]})  # fmt: skip
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "trainer-control", "namespace": kube.ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rljob-control"},
                "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": kube.ns}]})  # fmt: skip
    return kube.token("trainer")


class Timer:
    """Paired samples per verb: (api seconds, direct seconds)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[float, float]]] = {}

    @staticmethod
    async def time(call: Callable[[], Awaitable[Any]]) -> float:
        t0 = time.perf_counter()
        await call()
        return time.perf_counter() - t0

    def add(self, verb: str, api: float, direct: float) -> None:
        self.samples.setdefault(verb, []).append((api, direct))

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for verb, pairs in self.samples.items():
            out[verb] = {
                "calls": len(pairs),
                "api": stats_ms([a for a, _ in pairs]),
                "direct": stats_ms([d for _, d in pairs]),
                "added": stats_ms([a - d for a, d in pairs]),
            }
        return out


def api_write_ms(cluster: Cluster, namespace: str, iters: int) -> dict[str, float]:
    """One merge patch of a ConfigMap through the API server, from this process: the cost of the
    status write every writing verb makes before it answers (a window makes two), in the same run."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    name = "control-bench-write"
    core.create_namespaced_config_map(namespace, {"metadata": {"name": name}, "data": {"n": "0"}})
    seconds = []
    for i in range(WARMUP + iters):
        t0 = time.perf_counter()
        core.patch_namespaced_config_map(name, namespace, {"data": {"n": str(i)}})
        if i >= WARMUP:
            seconds.append(time.perf_counter() - t0)
    core.delete_namespaced_config_map(name, namespace)
    return stats_ms(seconds)


async def measure_job(api_url: str, namespace: str, job: str, token: str, endpoints: list[str], iters: int) -> dict[str, Any]:
    """The trainer's calls on one job, each paired with its direct counterpart."""
    ctl = InferenceControllerClient(api_url, job, namespace, token=token, token_file=None, holder="bench-trainer")
    engines = [make_engine_client("vllm", e) for e in endpoints]

    async def direct_offload() -> None:
        async def one(c: Any) -> None:
            await c.flush_cache()
            await c.release_memory(OFFLOAD_TAGS)

        await asyncio.gather(*(one(c) for c in engines))

    async def direct_onload() -> None:
        await asyncio.gather(*(c.resume_memory(OFFLOAD_TAGS) for c in engines))

    timer = Timer()
    try:
        window: dict[str, Any] = {}

        async def start() -> None:
            window["w"] = await ctl.start_update_weights("bench-trainer")

        async def end() -> None:
            await ctl.end_update_weights(window["w"].snapshot)

        for i in range(WARMUP + iters):
            api_start = await Timer.time(start)
            api_end = await Timer.time(end)
            api_off = await Timer.time(lambda: ctl.offload(OFFLOAD_TAGS))  # controller and engines asleep
            api_on = await Timer.time(lambda: ctl.onload(OFFLOAD_TAGS))  # both awake again
            direct_off = await Timer.time(direct_offload)  # the same engine calls, the controller not told
            direct_on = await Timer.time(direct_onload)  # awake: both agree again
            api_cells = await Timer.time(ctl.cells)
            if i >= WARMUP:
                for verb, a, d in (("start_update_weights", api_start, 0.0), ("end_update_weights", api_end, 0.0),
                                   ("offload", api_off, direct_off), ("onload", api_on, direct_on),
                                   ("cells", api_cells, 0.0)):  # fmt: skip
                    timer.add(verb, a, d)
        report = timer.report()
        s, e = timer.samples["start_update_weights"], timer.samples["end_update_weights"]
        report["window"] = {"calls": len(s), "added": stats_ms([a1 + a2 for (a1, _), (a2, _) in zip(s, e, strict=True)])}
        return report
    finally:
        await ctl.close()
        for c in engines:
            await c.close()


def server_seconds(metrics_text: str) -> dict[str, tuple[float, float]]:
    """(sum, count) per verb of the operator's own rljob_controller_api_duration_seconds."""
    out: dict[str, list[float]] = {}
    for line in metrics_text.splitlines():
        for suffix, slot in (("_sum{", 0), ("_count{", 1)):
            if line.startswith("rljob_controller_api_duration_seconds" + suffix):
                verb = line.split('verb="', 1)[1].split('"', 1)[0]
                out.setdefault(verb, [0.0, 0.0])[slot] = float(line.rsplit(" ", 1)[1])
    return {v: (s, c) for v, (s, c) in out.items()}


def server_means_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean seconds the operator spent per call between two scrapes (warm-up included), in ms."""
    out = {}
    for verb, (s, c) in after.items():
        s0, c0 = before.get(verb, (0.0, 0.0))
        if c > c0:
            out[verb] = round((s - s0) / (c - c0) * 1e3, 2)
    return out


def run_job(cluster: Cluster, kube: Kube, op: OperatorProcess, token: str, job: dict[str, Any], iters: int,
            ready_timeout: float) -> dict[str, Any]:  # fmt: skip
    name, cells = job["metadata"]["name"], job["spec"]["inference"]["replicas"]
    kube.apply(job)
    try:
        wait_for(lambda: kube.status(name).get("ready") == f"{cells}/{cells}", ready_timeout, interval=0.5,
                 what=f"{name}: {cells} cells serving")  # fmt: skip
        endpoints = [e["endpoint"] for e in kube.status(name)["engines"]]
        before = server_seconds(op.metrics())
        res = asyncio.run(measure_job(op.api, kube.ns, name, token, endpoints, iters))
        res["server_mean_ms"] = server_means_ms(before, server_seconds(op.metrics()))
        return res
    finally:
        cluster.kubectl("delete", "rljob", name, "-n", kube.ns, "--wait=true", "--timeout=120s", check=False)


def bench(cluster: Cluster, namespace: str, cells: list[int], iters: int, vllm: bool,
          log_dir: str | None = None) -> dict[str, Any]:  # fmt: skip
    install_crd(cluster)
    kube = Kube(cluster, namespace)
    jobs = {f"ctl-{n}": make_rljob(f"ctl-{n}", replicas=n, standin_cells="all") for n in cells}
    if vllm:
        from tests.fixtures.vllm_server import BASE_SEED, tiny_model_path

        jobs["ctl-vllm"] = make_rljob("ctl-vllm", replicas=1, standin_cells="", model_path=tiny_model_path(BASE_SEED),
                                      startup_deadline=600)  # fmt: skip
    token = grant_control(kube, list(jobs))
    out: dict[str, Any] = {"iters": iters, "auth_cache_seconds": float(AUTH_CACHE_SECONDS), "jobs": {}}
    with tempfile.TemporaryDirectory(prefix="control-bench-") as d:
        op = OperatorProcess(cluster, namespace, Path(log_dir or d), identity="control-bench", resync=10.0,
                             extra_args=("--auth-cache", AUTH_CACHE_SECONDS))  # fmt: skip
        try:
            for key, job in jobs.items():
                res = run_job(cluster, kube, op, token, job, iters, 600 if key == "ctl-vllm" else 180)
                res["n_cells"] = job["spec"]["inference"]["replicas"]
                res["engine"] = "vllm" if key == "ctl-vllm" else "standin"
                res["api_write"] = api_write_ms(cluster, namespace, iters)  # right after the job's calls
                out["jobs"][key] = res
        finally:
            op.stop()
            release_rljobs(cluster, namespace)
    biggest = f"ctl-{max(cells)}"
    out["target_window_added_p50_ms"] = TARGET_ADDED_MS
    out["target_met"] = out["jobs"][biggest]["window"]["added"]["p50_ms"] <= TARGET_ADDED_MS
    return out


def summary_line(result: dict[str, Any]) -> str:
    parts = []
    for key, r in result["jobs"].items():
        parts.append(f"{key} ({r['engine']}): window +{r['window']['added']['p50_ms']:.1f} ms p50 "
                     f"(p99 {r['window']['added']['p99_ms']:.1f}), offload +{r['offload']['added']['p50_ms']:.1f}, "
                     f"onload +{r['onload']['added']['p50_ms']:.1f}, cells {r['cells']['api']['p50_ms']:.1f} ms, "
                     f"one API write {r['api_write']['p50_ms']:.1f} ms")  # fmt: skip
    verdict = "met" if result["target_met"] else "MISSED"
    return f"control_bench: added latency p50: {'; '.join(parts)}; target <= {TARGET_ADDED_MS:g} ms {verdict}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--vllm", action="store_true", help="also one job of one real vLLM CPU engine (about 3.5 GiB)")
    p.add_argument("--smoke", action="store_true", help="2 cells, 3 calls per verb (what CI runs)")
    p.add_argument("--json-out")
    p.add_argument("--log-dir", help="keep the operator's log here")
    args = p.parse_args()
    if args.smoke:
        args.cells, args.iters, args.vllm = [2], 3, False
    started = time.time()
    cluster = open_cluster()
    with bench_namespace(cluster, "control-bench") as ns:
        result = bench(cluster, ns, args.cells, args.iters, args.vllm, args.log_dir)
    result["wall_s"] = round(time.time() - started, 1)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    print(summary_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
