"""KubeRay's own reaction to a killed (and to a hung) worker of a RayCluster: heal_bench's contrast.

The real KubeRay operator v1.5.0 (tests/cluster/kuberay.py) reconciles one RayCluster of
1 head + W workers in the same cluster and run as heal_bench's RLJob side. The head is a
kwok-simulated pod; each worker pod is labelled for the test cluster's agent, so its container
is a real local process: the same stand-in engine the RLJob side's cells run
(tests/engine_standin, `--host $(POD_IP) --port 8000`). The RayCluster carries
`ray.io/overwrite-container-cmd: "true"`, so KubeRay keeps that command instead of generating
`ray start`, and the workers have `restartPolicy: Never`, as the operator's engine pods do.

The fault is exactly the RLJob side's: SIGKILL of the worker's process (its pid is the agent's
pod annotation). The agent then reports the pod the way a kubelet reports a container that died
under `restartPolicy: Never`: phase Failed, the container terminated with exit code 137. (Under
`Always` a kubelet would restart the container in place and KubeRay would do nothing at all:
ray-operator v1.5.0 `shouldDeletePod` deletes only terminal pods, or Running ones whose Ray
container terminated under `Never`.) Moments, from watches of the pods, the RayCluster and its
Events, each stamped on receipt (monotonic, the RLJob side's clock):

  pod_failed       the killed pod Failed (the agent's report: the input both operators get)
  kuberay_deletes  the killed pod has a deletionTimestamp (KubeRay's own reaction)
  event            KubeRay's `DeletedWorkerPod` Event received
  status_degraded  status.readyWorkerReplicas below W
  pod_created      the replacement pod ADDED (KubeRay creates it in a later reconcile:
                   v1.5.0 creates none in the reconcile that deleted one)
  running          the replacement Running (kwok)
  serving          the replacement's stand-in answers /health (polled, 0.1 s): comparable to
                   the RLJob side's PendingWeights, which needs a passing probe
  status_ready     status.readyWorkerReplicas back at W

Hang: SIGSTOP of a worker's process (the socket stays open, nothing answers). KubeRay has no
health check of its own; the only ones are the exec probes it injects into the Ray container
for the kubelet (readiness every 5 s x 10, liveness every 5 s x 120, against Ray's dashboard
agent: a stand-in fails them like a hung raylet would). kwok runs no probes, so what is
measured is KubeRay's own reaction over a window: whether the pod, the RayCluster's status or
the worker set changed at all. A real kubelet would mark the pod NotReady after ~50 s and
restart the container in place after ~600 s (no replacement pod; KubeRay still does nothing).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.heal_common import follow, spread
from tests.cluster.fixtures import Cluster
from tests.cluster.kuberay import KubeRayProcess, kuberay_dir
from tests.cluster.waiting import wait_for
from tests.integration.operator_harness import PID_ANNOTATION, PROCESS_LABEL, STANDIN_DIR

RAY_GROUP, RAY_VERSION, RAY_PLURAL = "ray.io", "v1", "rayclusters"
WORKER_GROUP = "engine"
ENGINE_PORT = 8000
MOMENTS = ("pod_failed", "kuberay_deletes", "event", "status_degraded", "pod_created", "running", "serving",
           "status_ready")  # fmt: skip
TINY = {"requests": {"cpu": "10m", "memory": "16Mi"}}
ANYWHERE = [{"operator": "Exists"}]  # the test cluster's GPU nodes are tainted; these pods need none


def heal_raycluster(name: str, workers: int) -> dict[str, Any]:
    """1 kwok-simulated head + `workers` stand-in engine workers, each a real process (see above)."""
    worker = {
        "metadata": {"labels": {PROCESS_LABEL: "process"}},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": ANYWHERE,
            "containers": [{
                "name": "ray-worker", "image": "rayproject/ray:2.52.0", "resources": TINY,
                "command": [sys.executable, str(STANDIN_DIR / "rljob_engine_standin.py"),
                            "--host", "$(POD_IP)", "--port", str(ENGINE_PORT)],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            }],
        },
    }  # fmt: skip
    head = {"spec": {"tolerations": ANYWHERE,
                     "containers": [{"name": "ray-head", "image": "rayproject/ray:2.52.0", "resources": TINY}]}}  # fmt: skip
    return {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": name, "annotations": {"ray.io/overwrite-container-cmd": "true"}},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": head},
            "workerGroupSpecs": [{"groupName": WORKER_GROUP, "replicas": workers, "minReplicas": workers,
                                  "maxReplicas": workers, "rayStartParams": {}, "template": worker}],
        },
    }  # fmt: skip


@dataclass(frozen=True)
class PodSeen:
    t: float
    kind: str  # ADDED / MODIFIED / DELETED
    name: str
    phase: str
    deleting: bool
    ip: str
    pid: str


@dataclass
class KillTrial:
    pod: str
    at: float
    moments: dict[str, float] = field(default_factory=dict)
    replacement: str = ""

    def seconds(self) -> dict[str, float | None]:
        return {m: (round(self.moments[m] - self.at, 3) if m in self.moments else None) for m in MOMENTS}


@dataclass
class RayRecorder:
    """Watches of the RayCluster's worker pods, the RayCluster and its Events (receipt time)."""

    cluster: Cluster
    namespace: str
    name: str
    pods: list[PodSeen] = field(default_factory=list)
    ready: list[tuple[float, int]] = field(default_factory=list)  # status.readyWorkerReplicas
    events: list[tuple[float, str, str]] = field(default_factory=list)  # reason, message
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> RayRecorder:
        for target in (self._watch_pods, self._watch_cluster, self._watch_events):
            threading.Thread(target=target, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch_pods(self) -> None:
        from kubernetes import client

        def on_event(t: float, ev: dict[str, Any]) -> None:
            p = ev["object"]
            seen = PodSeen(t, ev["type"], p.metadata.name, str(p.status.phase if p.status else ""),
                           p.metadata.deletion_timestamp is not None, str((p.status and p.status.pod_ip) or ""),
                           str((p.metadata.annotations or {}).get(PID_ANNOTATION, "")))  # fmt: skip
            with self._lock:
                self.pods.append(seen)

        follow(self._stop, client.CoreV1Api(self.cluster.api()).list_namespaced_pod, self.namespace,
               on_event=on_event, label_selector=f"ray.io/cluster={self.name},ray.io/group={WORKER_GROUP}")  # fmt: skip

    def _watch_cluster(self) -> None:
        from kubernetes import client

        def on_event(t: float, ev: dict[str, Any]) -> None:
            obj = ev["object"]
            if obj.get("metadata", {}).get("name") == self.name:
                with self._lock:
                    self.ready.append((t, int((obj.get("status") or {}).get("readyWorkerReplicas") or 0)))

        follow(self._stop, client.CustomObjectsApi(self.cluster.api()).list_namespaced_custom_object, RAY_GROUP,
               RAY_VERSION, self.namespace, RAY_PLURAL, on_event=on_event)  # fmt: skip

    def _watch_events(self) -> None:
        from kubernetes import client

        seen: set[str] = set()  # a re-opened watch lists every Event again as ADDED: only the first sight counts

        def on_event(t: float, ev: dict[str, Any]) -> None:
            e = ev["object"]
            if ev["type"] == "ADDED" and e.involved_object.name == self.name and e.metadata.uid not in seen:
                seen.add(e.metadata.uid)
                with self._lock:
                    self.events.append((t, str(e.reason), str(e.message)))

        follow(self._stop, client.CoreV1Api(self.cluster.api()).list_namespaced_event, self.namespace,
               on_event=on_event)  # fmt: skip

    def snapshot(self) -> tuple[list[PodSeen], list[tuple[float, int]], list[tuple[float, str, str]]]:
        with self._lock:
            return list(self.pods), list(self.ready), list(self.events)

    def workers(self) -> dict[str, PodSeen]:
        """The worker pods as last seen (gone ones left out)."""
        last: dict[str, PodSeen] = {}
        for p in self.snapshot()[0]:
            last[p.name] = p
        return {n: p for n, p in last.items() if p.kind != "DELETED"}

    def whole(self, workers: int) -> bool:
        """W workers, each Running with its process started and none being deleted, and status ready W."""
        ready = self.snapshot()[1]
        live = [p for p in self.workers().values() if p.phase == "Running" and p.pid and not p.deleting]
        return len(live) == workers == len(self.workers()) and bool(ready) and ready[-1][1] == workers


def resolve(trial: KillTrial, before: set[str], workers: int, pods: list[PodSeen], ready: list[tuple[float, int]],
            events: list[tuple[float, str, str]]) -> None:  # fmt: skip
    """Fill in the moments a kill trial's watches saw (pure: the recorder's lists in, the trial out)."""
    m = trial.moments
    for p in pods:
        if p.t < trial.at:
            continue
        if p.name == trial.pod:
            if p.phase == "Failed":
                m.setdefault("pod_failed", p.t)
            if p.deleting or p.kind == "DELETED":
                m.setdefault("kuberay_deletes", p.t)
        elif p.name not in before and p.kind != "DELETED":
            trial.replacement = trial.replacement or p.name
            if p.name == trial.replacement:
                m.setdefault("pod_created", p.t)
                if p.phase == "Running":
                    m.setdefault("running", p.t)
    for t, reason, message in events:
        if t >= trial.at and reason == "DeletedWorkerPod" and trial.pod in message:
            m.setdefault("event", t)
    for t, n in ready:
        if t >= trial.at and n < workers:
            m.setdefault("status_degraded", t)
        if "status_degraded" in m and t >= m["status_degraded"] and n == workers:
            m.setdefault("status_ready", t)


def health_ok(ip: str) -> bool:
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(f"http://{ip}:{ENGINE_PORT}/health", timeout=1) as r:
            return int(r.status) == 200
    return False


def kill_trial(rec: RayRecorder, workers: int, index: int, timeout: float = 120) -> KillTrial:
    """SIGKILL one worker's process; wait until a replacement serves and the status is whole again."""
    wait_for(lambda: rec.whole(workers), timeout, interval=0.2, what="RayCluster whole before a kill")
    live = rec.workers()
    before = set(live)
    victim = sorted(live)[index % len(live)]
    trial = KillTrial(victim, time.monotonic())
    os.kill(int(live[victim].pid), signal.SIGKILL)

    def served() -> bool:
        pods, ready, events = rec.snapshot()
        resolve(trial, before, workers, pods, ready, events)
        if "serving" not in trial.moments and trial.replacement:
            new = rec.workers().get(trial.replacement)
            if new and new.phase == "Running" and new.ip and health_ok(new.ip):
                trial.moments["serving"] = time.monotonic()
        return "serving" in trial.moments and rec.whole(workers)

    wait_for(served, timeout, interval=0.1, what=f"replacement of {victim} serving")
    return trial


def hang_trial(rec: RayRecorder, workers: int, window: float, timeout: float = 120) -> dict[str, Any]:
    """SIGSTOP one worker's process and watch `window` s for any reaction; then SIGKILL it (cleanup)."""
    wait_for(lambda: rec.whole(workers), timeout, interval=0.2, what="RayCluster whole before a hang")
    live = rec.workers()
    victim = sorted(live)[0]
    pid = int(live[victim].pid)
    at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(window)
        pods, ready, events = rec.snapshot()
        after = [p for p in pods if p.t >= at]
        out = {
            "window_s": window,
            "victim_pod_changed": any(p.name == victim and (p.phase != "Running" or p.deleting) for p in after),
            "pods_created": len({p.name for p in after if p.name not in live}),
            "ready_changed": any(n != workers for t, n in ready if t >= at),
            "kuberay_events": [reason for t, reason, _ in events if t >= at],
            "health_answers": health_ok(live[victim].ip),
        }
        out["reaction"] = "none" if not (out["victim_pod_changed"] or out["pods_created"] or out["ready_changed"]
                                         or out["kuberay_events"]) else "some"  # fmt: skip
        return out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def summarize_kills(trials: list[KillTrial]) -> dict[str, Any]:
    out: dict[str, Any] = {"trials": len(trials)}
    for m in MOMENTS:
        out[m] = spread([v for v in (tr.seconds()[m] for tr in trials) if v is not None])
    out["raw_s"] = [tr.seconds() for tr in trials]
    return out


def run_kuberay(cluster: Cluster, namespace: str, log_dir: Path, trials: int, workers: int,
                hang_window: float) -> dict[str, Any]:  # fmt: skip
    """The KubeRay side: `trials` kills, one at a time, then one hang watched for `hang_window` s."""
    build = kuberay_dir()
    if build is None or not (build / "bin" / "ray-operator").is_file():
        return {"not_run": "KubeRay is not built (tests/cluster/build)"}
    from kubernetes import client

    started = time.monotonic()
    name = "heal-ray"
    custom = client.CustomObjectsApi(cluster.api())
    kuberay = KubeRayProcess(cluster, build, log_dir / "kuberay.log", namespaces=(namespace,))
    rec = RayRecorder(cluster, namespace, name).start()
    out: dict[str, Any] = {"operator": "ray-operator v1.5.0", "workers": workers,
                           "kuberay_start_s": round(time.monotonic() - started, 1)}  # fmt: skip
    try:
        custom.create_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, RAY_PLURAL,
                                               heal_raycluster(name, workers))  # fmt: skip
        wait_for(lambda: rec.whole(workers), 180, interval=0.5, what=f"{name}: every worker Running")
        out["raycluster_whole_s"] = round(time.monotonic() - started, 1)
        out["kill"] = summarize_kills([kill_trial(rec, workers, i) for i in range(trials)])
        out["hang"] = hang_trial(rec, workers, hang_window) if hang_window > 0 else None
    finally:
        rec.stop()
        cluster.kubectl("delete", "raycluster", name, "-n", namespace, "--wait=false", check=False)
        kuberay.stop()
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out
