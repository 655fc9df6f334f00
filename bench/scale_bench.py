"""Fleets of jobs: N RLJobs applied at once, beside N RayClusters reconciled by the real KubeRay.

    .venv/bin/python bench/scale_bench.py [--jobs 1 10 100] [--steady 300] [--changes 20]
        [--kuberay BIN] [--json-out FILE]
    .venv/bin/python bench/scale_bench.py --smoke       # 2 jobs, short steady state: CI

Against the test cluster of this worktree (tests/cluster/up, run here if needed), for each N:

- RLJobs: N jobs of 4 cells x 2 pods (`gpusPerEngine 16`, `gpusPerNode 8`), the trainer a
  `workloadRef` (no trainer pods), created at once (16 client threads) in a fresh namespace
  watched by one `rljob-operator` process (production settings: resync 10 s, Lease 15/10/2 s).
  The engines are one process, tests/engine_standin/rljob_standin_fleet.py, that answers the
  stand-in's routes on every pod address as soon as the pod has one (the cheapest engine: the
  operator's probes reach a real HTTP server, nothing else runs).
- RayClusters (when a KubeRay binary is given or built by tests/cluster/build): N clusters of
  1 head + 7 workers, each pod 8 GPUs like the engine pods, reconciled by the real KubeRay
  operator as a process against the same API server, on the same nodes, after the RLJobs are
  gone.

Simulated nodes `scale-<i>` (64 GPUs, 110 pods, loopback pod CIDRs 127.(71+i/256).(i%256).0/24,
untainted) are added until one node per job exists, and deleted at the end. Measured for each side: time from the first
create to all pods created (first seen by a watch) and to all jobs ready (RLJob `Ready=True`,
RayCluster `state: ready`), pods/s, the operator's peak RSS (VmHWM) and CPU seconds (ramp and
steady state), the API server's own `apiserver_request_total` by verb over the ramp and over the
steady state (after `--settle` seconds), the steady state's writes by resource (writes other
than Leases and Nodes are the operators': kwok and the control plane write only those there),
mutating request p99 (`apiserver_request_duration_seconds`, POST/PUT/PATCH/APPLY/DELETE) and the
reconcile latency of a changed job (`--changes` jobs one after another: replicas 4 -> 5, until
the new cell's first pod is seen; RayCluster workers 7 -> 8, until the new worker pod is seen),
and when the fleet's pods were bound, Running, Ready and (an RLJob's cell leaders) labelled
serving (`pod_timeline_seconds`: which step a slow ramp waited on).

Prints one JSON object, then a one-line summary. Targets (issue 13, 1,000 jobs): RSS <= 256 MiB,
zero operator writes/s at steady state apart from the Lease, replicas 4 -> 5 p99 <= 2 s,
RLJobs ready no slower than RayClusters.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rljob_operator.labels import SERVING as SERVING_LABEL  # noqa: E402

from tests.cluster.fixtures import Cluster, cache_dir, wait_for  # noqa: E402
from tests.integration.operator_harness import OperatorProcess, free_port, install_crd, make_rljob  # noqa: E402

FLEET = ROOT / "tests" / "engine_standin" / "rljob_standin_fleet.py"
KUBERAY_READY = Path("/work/kuberay-ready")
PODS_PER_JOB = 8
NODE_GPUS = 64
MUTATING = ("POST", "PUT", "PATCH", "APPLY", "DELETE")
WRITES = (*MUTATING, "DELETECOLLECTION")
BACKGROUND_RESOURCES = ("leases", "nodes")  # written by kwok and the control plane at steady state
PRODUCTION_FLAGS = (
    "--resync",
    "10",
    "--lease-duration",
    "15",
    "--renew-deadline",
    "10",
    "--retry-period",
    "2",
)
MIB = 2**20


# -- pure: the API server's metrics --------------------------------------------------------------
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:]+)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class ApiMetrics:
    """The counters of one scrape of kube-apiserver's /metrics that this bench reads."""

    requests: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (verb, resource, subresource)
    mutating_buckets: Counter[float] = field(default_factory=Counter)  # le -> cumulative count

    def minus(self, before: ApiMetrics) -> ApiMetrics:
        return ApiMetrics(self.requests - before.requests, self.mutating_buckets - before.mutating_buckets)


def parse_metrics(text: str) -> ApiMetrics:
    out = ApiMetrics()
    for line in text.splitlines():
        if not line.startswith(("apiserver_request_total{", "apiserver_request_duration_seconds_bucket{")):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        value = float(m["value"])
        if m["name"] == "apiserver_request_total":
            out.requests[
                (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
            ] += int(value)
        elif labels.get("verb") in MUTATING:
            le = labels.get("le", "+Inf")
            out.mutating_buckets[math.inf if le == "+Inf" else float(le)] += int(value)
    return out


def pool_waits(text: str) -> dict[str, dict[str, float | None]]:
    """The operator's Kubernetes-call waits for a pool thread, by queue (outside, work, resync), from
    its own /metrics (`rljob_kube_api_queue_wait_seconds`): calls, p50, p99 over its whole run."""
    buckets: dict[str, Counter[float]] = {}
    for line in text.splitlines():
        if not line.startswith("rljob_kube_api_queue_wait_seconds_bucket{"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        le = labels["le"]
        buckets.setdefault(labels["queue"], Counter())[math.inf if le == "+Inf" else float(le)] += int(
            float(m["value"])
        )
    return {
        queue: {"calls": b[math.inf], "p50": histogram_quantile(0.5, b), "p99": histogram_quantile(0.99, b)}
        for queue, b in sorted(buckets.items())
    }


def metric_total(text: str, name: str) -> float:
    """The sum of a metric's samples over all its labels in a /metrics page (e.g. the operator's
    `rljob_reconcile_total`: its passes over the whole run, all jobs)."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is not None and m["name"] == name:
            total += float(m["value"])
    return total


def by_verb(m: ApiMetrics) -> dict[str, int]:
    c: Counter[str] = Counter()
    for (verb, _r, _s), n in m.requests.items():
        c[verb] += n
    return dict(sorted(c.items()))


def writes_by_resource(m: ApiMetrics) -> dict[str, int]:
    c: Counter[str] = Counter()
    for (verb, resource, sub), n in m.requests.items():
        if verb in WRITES and n:
            c[f"{verb} {resource}{'/' + sub if sub else ''}"] += n
    return dict(sorted(c.items()))


def foreground_writes(m: ApiMetrics) -> int:
    """Writes on anything but Leases and Nodes (kwok's heartbeats, the control plane's and the operators' Leases)."""
    return sum(
        n for (verb, res, _s), n in m.requests.items() if verb in WRITES and res not in BACKGROUND_RESOURCES
    )


def audit_writes(lines: Iterator[str], since: float, until: float, agents: tuple[str, ...]) -> dict[str, int]:
    """Writes in the API server's audit log by one client (user agent prefix) in [since, until)
    (epoch seconds), by verb and resource: who wrote, where the metrics cannot say. The test
    cluster's audit policy (tests/cluster/audit-policy.yaml) logs the writes of pods, Services,
    Secrets, Deployments, Jobs, NetworkPolicies, RayClusters, RLJobs (and their status) and
    Leases, not Events. `agents`: user-agent prefixes (the operator's client and kopf's)."""
    c: Counter[str] = Counter()
    for line in lines:
        if not any(a in line for a in agents):
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("stage") != "ResponseComplete" or not str(ev.get("userAgent", "")).startswith(agents):
            continue
        at = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        if since <= at < until:
            ref = ev.get("objectRef") or {}
            sub = ref.get("subresource")
            c[f"{ev['verb']} {ref.get('resource', '')}{'/' + sub if sub else ''}"] += 1
    return dict(sorted(c.items()))


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative buckets (linear within the bucket)."""
    les = sorted(b for b in buckets if buckets[b] >= 0)
    if not les or buckets.get(math.inf, 0) <= 0:
        return None
    total = buckets[math.inf]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le in les:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return prev_le
            span = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / span if span else 0.0)
        prev_le, prev_count = le, count
    return prev_le


def quantiles(xs: Sequence[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None, "max": None}
    s = sorted(xs)
    return {
        "p50": statistics.median(s),
        "p99": s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)],
        "max": s[-1],
    }


# -- pure: manifests ----------------------------------------------------------------------------
def scale_nodes_yaml(first: int, count: int) -> str:
    docs = []
    for i in range(first, first + count):
        cidr = f"127.{71 + i // 256}.{i % 256}.0/24"
        docs.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"scale-{i}", "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                         "labels": {"type": "kwok", "kubernetes.io/hostname": f"scale-{i}", "kubernetes.io/os": "linux",
                                    "testcluster.rljob.io/pool": "scale", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
            "status": {"capacity": {"cpu": "1000", "memory": "8Ti", "pods": "110", "nvidia.com/gpu": str(NODE_GPUS)},
                       "allocatable": {"cpu": "1000", "memory": "8Ti", "pods": "110", "nvidia.com/gpu": str(NODE_GPUS)},
                       "addresses": [{"type": "InternalIP", "address": f"127.61.{1 + i // 250}.{1 + i % 250}"},
                                     {"type": "Hostname", "address": f"scale-{i}"}]},
        })  # fmt: skip
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def scale_rljob(name: str, probe_interval: int, executor: bool = False) -> dict[str, Any]:
    """The test RLJob at the issue's shape, engines answered by the fleet stand-in (no process pods).

    The issue's fleet has no trainer or executor pods: the trainer is a workloadRef and, unless
    `executor`, spec.rollout is left out, so the job is its engine fleet alone (as a RayCluster
    is its Ray pods). With `executor` each job also has its executor Deployment, Service and
    policy, the shape measured before 2026-12-02 (their writes, and the Deployment and
    ReplicaSet controllers' writes for them, were ~27 % of the ramp's requests at N=100)."""
    job = make_rljob(name, replicas=4)
    if not executor:
        del job["spec"]["rollout"]
    inf = job["spec"]["inference"]
    inf.update(gpusPerEngine=16, gpusPerNode=8, tensorParallelSize=16)
    inf.pop("podMetadata", None)
    inf["env"] = []
    inf["healthCheck"] = {
        "intervalSeconds": probe_interval,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
        "startupDeadlineSeconds": 1200,
    }
    return job


GPU_POD = {
    "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "8"},
    "limits": {"nvidia.com/gpu": "8"},
}
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def ray_pod_template(role: str) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [{"name": f"ray-{role}", "image": "rayproject/ray:2.52.0", "resources": GPU_POD}],
            "tolerations": TOLERATE_GPU,
        }
    }


def scale_raycluster(name: str, workers: int = PODS_PER_JOB - 1) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": ray_pod_template("head")},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "minReplicas": 0, "maxReplicas": 64,
                                  "rayStartParams": {}, "template": ray_pod_template("worker")}],
        },
    }  # fmt: skip


# -- I/O ------------------------------------------------------------------------------------------
def the_cluster() -> Cluster:
    """This worktree's test cluster (tests/cluster/up is idempotent: it starts one if none runs)."""
    subprocess.run([str(ROOT / "tests" / "cluster" / "up")], check=True, capture_output=True, timeout=900)
    bin_dir = subprocess.run(
        [str(ROOT / "tests" / "cluster" / "build"), "--print"], check=True, capture_output=True, text=True
    ).stdout.strip()
    cache = cache_dir()
    return Cluster(cache / "kubeconfig", Path(bin_dir), cache)


def scrape(cluster: Cluster) -> ApiMetrics:
    return parse_metrics(cluster.kubectl("get", "--raw", "/metrics", timeout=60).stdout)


def managed_nodes(nodes: Mapping[str, Any], leases: Mapping[str, Any]) -> int:
    """How many of `nodes` (a NodeList) are Ready and held by kwok: their Lease in
    kube-node-lease (`leases`, a LeaseList) has a holder and belongs to this Node's uid.

    Ready alone is not enough: kwok plays a node's pod stages only once it holds the node's
    Lease, and a node made again under the name of a deleted one (the previous run's) has the
    old node's Lease until the garbage collector removes it. Pods bound meanwhile were made
    Running only when kwok took the new Lease and listed the node's pods, ~50 s later
    (bench/RESULTS.md, "Where the ramp waits")."""
    held = {
        (lease["metadata"]["name"], ref.get("uid"))
        for lease in leases.get("items") or []
        if (lease.get("spec") or {}).get("holderIdentity")
        for ref in lease["metadata"].get("ownerReferences") or []
    }
    return sum(
        1
        for node in nodes.get("items") or []
        if (node["metadata"]["name"], node["metadata"].get("uid")) in held
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (node.get("status") or {}).get("conditions") or []
        )
    )


LEASE_DELETE_CHUNK = 50


def ensure_nodes(cluster: Cluster, count: int) -> int:
    have = len(
        cluster.kubectl("get", "nodes", "-l", "testcluster.rljob.io/pool=scale", "-o", "name").stdout.split()
    )
    if have < count:
        # an earlier run's nodes of these names left Leases the new nodes would wait out. Only
        # those that exist are named: kubectl deletes one name per request, and 1,000 names of
        # which none exists took it minutes
        names = {f"scale-{i}" for i in range(have, count)}
        listed = cluster.kubectl("get", "leases", "-n", "kube-node-lease", "-o", "name").stdout.split()
        stale = sorted(names.intersection(n.rsplit("/", 1)[-1] for n in listed))
        # right after a run of 1,000 all of them are: one kubectl for all took over its 120 s
        # bound (a request per name), so they go in chunks, a few kubectls at a time
        chunks = [stale[i : i + LEASE_DELETE_CHUNK] for i in range(0, len(stale), LEASE_DELETE_CHUNK)]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda names: cluster.kubectl(
                "delete", "lease", "-n", "kube-node-lease", "--ignore-not-found", "--wait=false", *names
            ), chunks))  # fmt: skip
        cluster.kubectl("create", "-f", "-", input=scale_nodes_yaml(have, count - have), timeout=600)

    def ready() -> bool:
        nodes = cluster.kubectl("get", "nodes", "-l", "testcluster.rljob.io/pool=scale", "-o", "json").stdout
        leases = cluster.kubectl("get", "leases", "-n", "kube-node-lease", "-o", "json").stdout
        return managed_nodes(json.loads(nodes), json.loads(leases)) >= count

    wait_for(ready, 300, interval=1, what=f"{count} scale nodes Ready and held by kwok")
    return max(have, count)


@dataclass
class ProcStats:
    cpu_seconds: float
    rss_bytes: int
    peak_rss_bytes: int


def proc_stats(pid: int) -> ProcStats:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    kib = lambda k: int(status[k].split()[0]) * 1024  # noqa: E731
    return ProcStats((int(fields[11]) + int(fields[12])) / ticks, kib("VmRSS"), kib("VmHWM"))


class Recorder:
    """Watches (in threads) when each pod is first seen and each job first ready, on this clock."""

    def __init__(self, cluster: Cluster, namespace: str, plural: str, group: str, version: str,
                 is_ready: Callable[[dict[str, Any]], bool]) -> None:  # fmt: skip
        from kubernetes import client

        self.api_client = cluster.api()
        self.api_client.user_agent = "scale-bench"
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.ns, self.plural, self.group, self.version, self.is_ready = (
            namespace,
            plural,
            group,
            version,
            is_ready,
        )
        self.pod_seen: dict[str, float] = {}
        # when each pod was first seen in each later state (`pod_milestones`): where a ramp's
        # time goes between the last pod made and the last job ready
        self.pod_at: dict[str, dict[str, float]] = {m: {} for m in MILESTONES}
        self.ready_at: dict[str, float] = {}
        self.cond = threading.Condition()
        self.stopped = False
        for target in (self._pods, self._jobs):
            threading.Thread(target=target, daemon=True).start()

    def _follow(
        self, list_fn: Callable[..., Any], args: tuple[Any, ...], on: Callable[[dict[str, Any]], None]
    ) -> None:
        from kubernetes import watch

        while not self.stopped:
            try:
                body = json.loads(list_fn(*args, _preload_content=False).data)
                for obj in body.get("items") or []:
                    on(obj)
                for ev in watch.Watch().stream(
                    list_fn,
                    *args,
                    resource_version=body["metadata"]["resourceVersion"],
                    timeout_seconds=120,
                    deserialize=False,
                ):
                    if ev["type"] == "ERROR" or self.stopped:
                        break
                    if ev["type"] != "DELETED":
                        on(ev["object"])
            except Exception as e:  # a broken watch: list again
                print(f"recorder watch ended: {e!r}", file=sys.stderr)

    def _pods(self) -> None:
        def on(pod: dict[str, Any]) -> None:
            name = pod["metadata"]["name"]
            now = time.monotonic()
            with self.cond:
                for m in pod_milestones(pod):
                    self.pod_at[m].setdefault(name, now)
                if name not in self.pod_seen:
                    self.pod_seen[name] = now
                    self.cond.notify_all()

        self._follow(self.core.list_namespaced_pod, (self.ns,), on)

    def _jobs(self) -> None:
        def on(obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            with self.cond:
                if name not in self.ready_at and self.is_ready(obj):
                    self.ready_at[name] = time.monotonic()
                    self.cond.notify_all()

        self._follow(
            self.custom.list_namespaced_custom_object, (self.group, self.version, self.ns, self.plural), on
        )

    def wait(self, pred: Callable[[], bool], timeout: float, what: str) -> float:
        """Block on the watches' notifications until pred() holds; the time it first held."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
                self.cond.wait(min(left, 1.0))
            return time.monotonic()

    def stop(self) -> None:
        self.stopped = True


MILESTONES = ("bound", "running", "ready", "serving")


def pod_milestones(pod: Mapping[str, Any]) -> list[str]:
    """The MILESTONES a pod has reached: scheduled to a node, phase Running, condition Ready,
    and (an RLJob's cell leader) labelled serving by the operator, which it does once the
    engine answered its probes."""
    status = pod.get("status") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    got = []
    if (pod.get("spec") or {}).get("nodeName"):
        got.append("bound")
    if status.get("phase") == "Running":
        got.append("running")
    if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        got.append("ready")
    if labels.get(SERVING_LABEL) == "true":
        got.append("serving")
    return got


def milestone_seconds(at: Mapping[str, float], t0: float, names: Sequence[str]) -> dict[str, float | None]:
    """When the pods `names` reached one milestone, as seconds from t0: median, 90th
    percentile and last (None: none did); `count` how many of them reached it."""
    xs = sorted(at[n] - t0 for n in names if n in at)
    if not xs:
        return {"count": 0, "p50": None, "p90": None, "last": None}
    return {
        "count": len(xs),
        "p50": round(statistics.median(xs), 1),
        "p90": round(xs[min(len(xs) - 1, math.ceil(0.9 * len(xs)) - 1)], 1),
        "last": round(xs[-1], 1),
    }


def rljob_ready(obj: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def raycluster_ready(obj: dict[str, Any]) -> bool:
    return (obj.get("status") or {}).get("state") == "ready"


@contextlib.contextmanager
def process(
    argv: list[str], log: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def create_all(objs: Sequence[dict[str, Any]], create: Callable[[dict[str, Any]], Any]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, objs))


def drop_namespace(
    cluster: Cluster, ns: str, plural_group: tuple[str, str] | None, wait: bool = True
) -> None:
    """Delete the namespace; with the operator stopped, its finalizers are dropped first.
    `wait`: until it is gone (its pods too, so the next side starts on free nodes)."""
    from kubernetes import client

    if plural_group is not None:
        plural, group = plural_group
        api = client.CustomObjectsApi(cluster.api())
        names = [
            o["metadata"]["name"]
            for o in api.list_namespaced_custom_object(group, "v1alpha1", ns, plural)["items"]
        ]
        create_all(
            [{"name": n} for n in names],
            lambda o: api.patch_namespaced_custom_object(
                group, "v1alpha1", ns, plural, o["name"], {"metadata": {"finalizers": None}}
            ),
        )

    def gone() -> bool:  # a failed kubectl (a slow API server) is not "gone": only NotFound is
        got = cluster.kubectl("get", "namespace", ns, check=False)
        if got.returncode != 0 and "NotFound" in got.stderr:
            return True
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        return False

    if wait:
        wait_for(gone, 900, interval=2, what=f"namespace {ns} gone")
    else:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@dataclass
class Side:
    """What one operator's run measured."""

    name: str
    jobs: int
    pods: int
    pods_created_s: float
    ready_s: float
    ramp: ApiMetrics
    steady: ApiMetrics
    steady_seconds: float
    ramp_cpu_s: float
    steady_cpu_s: float
    peak_rss_bytes: int
    end_rss_bytes: int
    change_latencies: list[float]
    steady_own_writes: dict[str, int]
    # per milestone (`pod_milestones`; "created" first), when the fleet's pods reached it
    pod_timeline: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        w = foreground_writes(self.steady)
        own = sum(n for k, n in self.steady_own_writes.items() if not k.endswith(" leases"))
        return {
            "jobs": self.jobs, "pods": self.pods,
            "pods_created_seconds": round(self.pods_created_s, 3), "ready_seconds": round(self.ready_s, 3),
            "pods_per_second": round(self.pods / self.pods_created_s, 1) if self.pods_created_s else None,
            "operator_peak_rss_mib": round(self.peak_rss_bytes / MIB, 1),
            # after the steady state and the changes: what the ramp's peak left held
            "operator_end_rss_mib": round(self.end_rss_bytes / MIB, 1),
            "operator_cpu_seconds": {"ramp": round(self.ramp_cpu_s, 2), "steady": round(self.steady_cpu_s, 2)},
            "requests_ramp_by_verb": by_verb(self.ramp),
            "requests_steady_by_verb": by_verb(self.steady),
            "ramp_writes_by_resource": writes_by_resource(self.ramp),
            "steady_seconds": round(self.steady_seconds, 1),
            "steady_writes_by_resource": writes_by_resource(self.steady),
            "steady_writes_per_second_not_leases_nodes": round(w / self.steady_seconds, 3) if self.steady_seconds else None,
            "steady_operator_writes_audited": self.steady_own_writes,
            "steady_operator_writes_per_second": round(own / self.steady_seconds, 3) if self.steady_seconds else None,
            "mutating_p99_seconds_ramp": histogram_quantile(0.99, self.ramp.mutating_buckets),
            "mutating_p99_seconds_steady": histogram_quantile(0.99, self.steady.mutating_buckets),
            "change_latency_seconds": {k: (round(v, 3) if v is not None else None)
                                       for k, v in quantiles(self.change_latencies).items()},
            "changes": len(self.change_latencies),
            # each change's, in the order made (jobs N/changes apart from the first): a slow one
            # is found by its place, not just seen in the p99
            "change_latencies_seconds": [None if math.isnan(v) else round(v, 3) for v in self.change_latencies],
            "pod_timeline_seconds": self.pod_timeline,
        }  # fmt: skip


def audit_log(cluster: Cluster) -> Path:
    return cluster.cache / "kwok" / "clusters" / cluster.name / "logs" / "audit.log"


def read_audit(cluster: Cluster, since: float, until: float, agents: tuple[str, ...]) -> dict[str, int]:
    with audit_log(cluster).open(errors="replace") as f:
        return audit_writes(iter(f), since, until, agents)


def measure_side(
    cluster: Cluster,
    name: str,
    ns: str,
    objs: list[dict[str, Any]],
    pid: int,
    rec: Recorder,
    create: Callable[[dict[str, Any]], Any],
    change: Callable[[str], str],
    agents: tuple[str, ...],
    args: argparse.Namespace,
) -> Side:
    """Create `objs` at once, wait for pods and readiness, steady state, then the changes."""
    n = len(objs)
    want_pods = n * PODS_PER_JOB
    m0, p0 = scrape(cluster), proc_stats(pid)
    t0 = time.monotonic()
    create_all(objs, create)
    t_pods = rec.wait(
        lambda: sum(1 for p in rec.pod_seen if is_fleet_pod(p)) >= want_pods,
        args.timeout,
        f"{want_pods} pods",
    )
    t_ready = rec.wait(lambda: len(rec.ready_at) >= n, args.timeout, f"{n} {name} ready")
    m1, p1 = scrape(cluster), proc_stats(pid)
    with rec.cond:
        fleet = [p for p in rec.pod_seen if is_fleet_pod(p)]
        timeline = {"created": milestone_seconds(rec.pod_seen, t0, fleet)} | {
            m: milestone_seconds(rec.pod_at[m], t0, fleet) for m in MILESTONES
        }
    time.sleep(args.settle)  # a measuring window, not a wait for state
    m2, p2, t2, w2 = scrape(cluster), proc_stats(pid), time.monotonic(), time.time()
    time.sleep(args.steady)
    m3, p3, t3, w3 = scrape(cluster), proc_stats(pid), time.monotonic(), time.time()
    own = read_audit(cluster, w2, w3, agents)
    latencies = []
    step = max(1, n // max(1, args.changes))
    for obj in objs[::step][: args.changes]:
        job = obj["metadata"]["name"]
        t = time.monotonic()
        new_pod = change(job)
        seen = rec.wait(lambda p=new_pod: p in rec.pod_seen, 120, f"{new_pod} created")  # type: ignore[misc]
        latencies.append(rec.pod_seen[new_pod] - t if seen else math.nan)
    p4 = proc_stats(pid)
    return Side(
        name,
        n,
        want_pods,
        t_pods - t0,
        t_ready - t0,
        m1.minus(m0),
        m3.minus(m2),
        t3 - t2,
        p1.cpu_seconds - p0.cpu_seconds,
        p3.cpu_seconds - p2.cpu_seconds,
        p4.peak_rss_bytes,
        p4.rss_bytes,
        latencies,
        own,
        timeline,
    )


def is_fleet_pod(name: str) -> bool:
    """Engine pods (`<job>-cell-...`) and Ray pods (`<cluster>-head-...`, `<cluster>-gpu-worker-...`), not executors."""
    return "-cell-" in name or "-head" in name or "-worker-" in name


def run_rljobs(cluster: Cluster, n: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    from kubernetes import client

    ns = f"scale-rljob-{n}-{int(time.time()) % 100000}"
    cluster.kubectl("create", "namespace", ns)
    # the executor Deployment's pods run as the trainer's ServiceAccount: without it the
    # ReplicaSet controller retries (and fails) a pod create all through the steady state
    cluster.kubectl("create", "serviceaccount", "rljob-trainer", "-n", ns)
    install_crd(cluster)
    api_client = cluster.api()
    api_client.user_agent = "scale-bench"
    custom = client.CustomObjectsApi(api_client)
    objs = [scale_rljob(f"j{i:04d}", args.probe_interval, args.executor) for i in range(n)]

    def create(obj: dict[str, Any]) -> None:
        custom.create_namespaced_custom_object("rljob.io", "v1alpha1", ns, "rljobs", obj)

    def change(job: str) -> str:
        custom.patch_namespaced_custom_object(
            "rljob.io", "v1alpha1", ns, "rljobs", job, {"spec": {"inference": {"replicas": 5}}}
        )
        return f"{job}-cell-4-g0-0"

    rec = Recorder(cluster, ns, "rljobs", "rljob.io", "v1alpha1", rljob_ready)
    operator, finished = None, False
    try:
        with process(
            [sys.executable, str(FLEET), "--kubeconfig", str(cluster.kubeconfig), "--namespace", ns],
            logs / f"fleet-{ns}.log",
        ) as fleet:
            wait_for(
                lambda: "fleet ready" in (logs / f"fleet-{ns}.log").read_text(), 60, what="fleet stand-in"
            )
            operator = OperatorProcess(cluster, ns, logs, identity="scale", extra_args=PRODUCTION_FLAGS)
            wait_for(operator.is_leader, 60, what="operator leads")
            side = measure_side(
                cluster,
                "RLJobs",
                ns,
                objs,
                operator.proc.pid,
                rec,
                create,
                change,
                ("rljob-operator/", "kopf/"),
                args,
            )
            assert fleet.poll() is None, "the fleet stand-in died"
            page = operator.metrics()
            waits = pool_waits(page)
            passes = metric_total(page, "rljob_reconcile_total")
            finished = True
    finally:
        rec.stop()
        if operator is not None:
            operator.stop()
        # a failed or stopped run leaves no fleet behind (the cluster is the suite's): go, unwaited
        drop_namespace(cluster, ns, ("rljobs", "rljob.io"), wait=finished and not args.smoke)
    return {**side.report(), "operator_pool_wait_seconds": waits, "operator_passes": passes}


def kuberay_binary(args: argparse.Namespace) -> str | None:
    if args.no_kuberay:
        return None
    if args.kuberay:
        return str(args.kuberay)
    built = subprocess.run([str(ROOT / "tests" / "cluster" / "build"), "--print-kuberay"], capture_output=True,
                           text=True, check=False)  # fmt: skip
    candidate = Path(built.stdout.strip() or "/nonexistent") / "bin" / "ray-operator"
    if built.returncode == 0 and candidate.is_file():
        return str(candidate)
    if KUBERAY_READY.exists():
        return KUBERAY_READY.read_text().strip() or None
    return None


def run_rayclusters(
    cluster: Cluster, n: int, binary: str, args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    """N RayClusters reconciled by the KubeRay operator `binary` (flags of ray-operator/main.go v1.5.0)."""
    from kubernetes import client

    ns = f"scale-kuberay-{n}-{int(time.time()) % 100000}"
    cluster.kubectl("create", "namespace", ns)
    api_client = cluster.api()
    api_client.user_agent = "scale-bench"
    custom = client.CustomObjectsApi(api_client)
    objs = [scale_raycluster(f"r{i:04d}") for i in range(n)]

    def create(obj: dict[str, Any]) -> None:
        custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", obj)

    def change(rc: str) -> str:
        before = {p for p in rec.pod_seen if p.startswith(f"{rc}-gpu-worker-")}
        spec = scale_raycluster(rc, PODS_PER_JOB)["spec"]
        custom.patch_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", rc, {"spec": {"workerGroupSpecs": spec["workerGroupSpecs"]}}
        )
        rec.wait(
            lambda: len({p for p in rec.pod_seen if p.startswith(f"{rc}-gpu-worker-")} - before) >= 1,
            120,
            f"{rc} 8th worker",
        )
        return next(iter({p for p in rec.pod_seen if p.startswith(f"{rc}-gpu-worker-")} - before))

    rec = Recorder(cluster, ns, "rayclusters", "ray.io", "v1", raycluster_ready)
    ensure_kuberay_crds(cluster, Path(binary).resolve().parent.parent / "crds")
    health = free_port()
    argv = [binary, f"--kubeconfig={cluster.kubeconfig}", "--enable-leader-election=false",
            f"--metrics-addr=127.0.0.1:{free_port()}", f"--health-probe-bind-address=127.0.0.1:{health}",
            "--log-stdout-encoder=console", f"--watch-namespace={ns}"]  # fmt: skip
    finished = False
    try:
        with process(argv, logs / f"kuberay-{ns}.log") as kuberay:
            wait_for(lambda: http_status(f"http://127.0.0.1:{health}/readyz") == 200 or kuberay.poll() is not None,
                     120, interval=0.5, what="KubeRay /readyz")  # fmt: skip
            assert kuberay.poll() is None, (
                f"KubeRay exited: {(logs / f'kuberay-{ns}.log').read_text()[-2000:]}"
            )
            side = measure_side(cluster, "RayClusters", ns, objs, kuberay.pid, rec, create, change,
                                (Path(binary).name + "/",), args)  # fmt: skip
            assert kuberay.poll() is None, "KubeRay exited"
            finished = True
    finally:
        rec.stop()
        drop_namespace(cluster, ns, None, wait=finished and not args.smoke)
    return side.report()


def ensure_kuberay_crds(cluster: Cluster, crds: Path) -> None:
    """KubeRay's manager exits when RayJob or RayService is unknown: install those from its build
    when missing (the RayCluster CRD is the one tests/cluster/up installs)."""
    for name in ("rayjobs", "rayservices"):
        if cluster.kubectl("get", "crd", f"{name}.ray.io", check=False).returncode != 0:
            cluster.kubectl("apply", "--server-side", "-f", str(crds / f"ray.io_{name}.yaml"))
            cluster.wait_established(f"{name}.ray.io")


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def ratios(rl: Mapping[str, Any], kr: Mapping[str, Any]) -> dict[str, float | None]:
    def r(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    return {
        "ready_seconds_rljob_over_kuberay": r(rl["ready_seconds"], kr["ready_seconds"]),
        "pods_created_seconds_rljob_over_kuberay": r(rl["pods_created_seconds"], kr["pods_created_seconds"]),
        "peak_rss_rljob_over_kuberay": r(rl["operator_peak_rss_mib"], kr["operator_peak_rss_mib"]),
        "change_p99_rljob_over_kuberay": r(
            rl["change_latency_seconds"]["p99"], kr["change_latency_seconds"]["p99"]
        ),
    }


def run(args: argparse.Namespace, cluster: Cluster | None = None) -> dict[str, Any]:
    cluster = cluster or the_cluster()
    binary = kuberay_binary(args)
    logs = Path(args.log_dir or tempfile.mkdtemp(prefix="scale-bench-"))
    logs.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "bench": "scale_bench", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "commit": git_commit(),
        "settings": {"steady_seconds": args.steady, "settle_seconds": args.settle, "changes": args.changes,
                     "probe_interval_seconds": args.probe_interval, "node_gpus": NODE_GPUS, "logs": str(logs),
                     "rljob_executor": args.executor},
        "kuberay": binary or "not run: no binary (pass --kuberay, or build it: tests/cluster/build)",
        "runs": [],
    }  # fmt: skip
    try:
        for n in args.jobs:
            # smoke: twice the nodes, so that a side never waits for the last one's pods to go
            result["settings"]["nodes"] = ensure_nodes(cluster, n * (2 if args.smoke else 1))
            row: dict[str, Any] = {"jobs": n, "rljob": run_rljobs(cluster, n, args, logs)}
            if binary:
                row["kuberay"] = run_rayclusters(cluster, n, binary, args, logs)
                row["ratios"] = ratios(row["rljob"], row["kuberay"])
            result["runs"].append(row)
            print(summary_row(row), file=sys.stderr, flush=True)
    finally:  # the cluster is shared by the suite: leave its own six nodes only
        cluster.kubectl(
            "delete", "nodes", "-l", "testcluster.rljob.io/pool=scale", "--wait=false", check=False
        )
    result["load_average_after"] = os.getloadavg()[0]
    return result


def git_commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return r.stdout.strip()


def summary_row(row: Mapping[str, Any]) -> str:
    rl = row["rljob"]
    s = (
        f"N={row['jobs']}: RLJobs ready {rl['ready_seconds']:.1f}s ({rl['pods_per_second']} pods/s), "
        f"RSS {rl['operator_peak_rss_mib']} MiB, steady writes/s {rl['steady_operator_writes_per_second']}, "
        f"4->5 p99 {rl['change_latency_seconds']['p99']}s"
    )
    if "kuberay" in row:
        kr = row["kuberay"]
        s += (
            f" | RayClusters ready {kr['ready_seconds']:.1f}s, RSS {kr['operator_peak_rss_mib']} MiB, "
            f"steady writes/s {kr['steady_operator_writes_per_second']}, ready ratio "
            f"{row['ratios']['ready_seconds_rljob_over_kuberay']}"
        )
    return s


def summary_line(result: Mapping[str, Any]) -> str:
    return "scale_bench: " + "; ".join(summary_row(r) for r in result["runs"])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 10, 100])
    p.add_argument("--steady", type=float, default=300.0, help="seconds of steady state measured")
    p.add_argument(
        "--settle", type=float, default=15.0, help="seconds after all are ready before the steady window"
    )
    p.add_argument("--changes", type=int, default=20, help="jobs changed one after another (replicas 4 -> 5)")
    p.add_argument(
        "--probe-interval", type=int, default=10, help="spec.inference.healthCheck.intervalSeconds"
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="bound of each wait for pods / readiness")
    p.add_argument(
        "--kuberay", help="KubeRay operator binary (default: the path in /work/kuberay-ready, if any)"
    )
    p.add_argument("--no-kuberay", action="store_true", help="RLJobs only")
    p.add_argument(
        "--executor",
        action="store_true",
        help="give every RLJob its rollout executor (Deployment, Service, policy): not the issue's fleet",
    )
    p.add_argument("--log-dir")
    p.add_argument("--json-out")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="2 jobs, 5 s of steady state, 2 changes, no wait for the namespaces to go",
    )
    args = p.parse_args(argv)
    if args.smoke:
        # probes every second: a steady state of 5 s holds several probes of every cell
        args.jobs, args.steady, args.settle, args.changes, args.timeout = [2], 5.0, 3.0, 2, 300.0
        args.probe_interval = 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # `bench/run`'s timeout (or a user's kill) sends SIGTERM: unwind through the `finally`s, which
    # stop the operators and delete the fleet's namespace and nodes, instead of dying with them there
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(args)
    text = json.dumps(result, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    print(text)
    print(summary_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
