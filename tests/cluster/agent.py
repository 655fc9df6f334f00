#!/usr/bin/env python3
"""Process agent of the test cluster: runs the real local process a pod stands for.

kwok simulates every pod; for pods labelled ``testcluster.rljob.io/run=process`` this agent
also runs the pod's first container as a local process once kwok has made the pod Running
with a podIP (a loopback address, see tests/cluster/README.md):

* argv = container ``command`` + ``args`` (``args`` alone if there is no command), with
  Kubernetes ``$(VAR)`` expansion (``$$`` escapes); the image is ignored;
* environment = the agent's own (so PATH points at the venv) + the container's ``env``
  (literal values, ``valueFrom.fieldRef`` for status.podIP, status.hostIP, metadata.name,
  metadata.namespace, metadata.uid, spec.nodeName, spec.serviceAccountName,
  metadata.labels/annotations['k'], and configMapKeyRef/secretKeyRef) and ``envFrom``;
* cwd = the repository root, its own session/process group, stdout+stderr to
  ``<cache>/logs/<namespace>_<pod>.log``;
* the pod is annotated ``testcluster.rljob.io/pid=<pid>``.

When the process exits the pod's status becomes terminal: exit code 0 (and restartPolicy not
Always) -> Succeeded/Completed, otherwise Failed with the container terminated, its exit code
(128+signal for a signal) and reason ``ProcessExited``. Processes are never restarted.

When the pod gets a deletionTimestamp (or disappears, or becomes terminal some other way,
e.g. kwok's pod-fail stage) the process group gets SIGTERM, then SIGKILL after
min(10 s, grace period); a pod being deleted is then deleted with grace 0 (kwok's fallback
deletes it at its deletionTimestamp only).

Pod networking (``--podnet-cni-bin``, given by ``up`` under ``RLJOB_TESTCLUSTER_PODNET=1``):
the agent runs inside the cluster's own network namespace and starts each process in a network
namespace of the pod's own, wired by the CNI plugins with the pod's podIP, and with a
resolv.conf naming the cluster DNS (podnet.py); the namespace is deleted when the process ends.

Restarts: SIGTERM/SIGINT to the agent stops all its processes (this is what
``tests/cluster/down`` does). If the agent dies otherwise, its processes keep running; a new
agent adopts a pod's process when the annotated pid is still alive and carries the pod's uid
in its environment (TESTCLUSTER_POD_UID), and marks the pod Failed (ProcessExited, exit code
unknown -> 255) when it is not.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import fcntl
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from podnet import TOKEN_SECONDS, PodNetwork, wrap  # tests/cluster/podnet.py (this script's directory)

LABEL = "testcluster.rljob.io/run"
LABEL_SELECTOR = f"{LABEL}=process"
PID_ANNOTATION = "testcluster.rljob.io/pid"
MARKER_ENV = "TESTCLUSTER_POD_UID"
KILL_AFTER_S = 10.0
REPO_ROOT = Path(__file__).resolve().parents[2]

log = logging.getLogger("testcluster-agent")


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------- expansion
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(value: str, mapping: dict[str, str]) -> str:
    """Kubernetes-style $(VAR) expansion: defined vars replaced, $$ -> $, others kept."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return mapping[name] if name in mapping else m.group(0)

    return _REF.sub(repl, value)


def _field_value(pod: client.V1Pod, path: str) -> str:
    meta, spec, status = pod.metadata, pod.spec, pod.status
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        d = (meta.labels if m.group(1) == "labels" else meta.annotations) or {}
        return d.get(m.group(2), "")
    simple = {
        "metadata.name": lambda: meta.name,
        "metadata.namespace": lambda: meta.namespace,
        "metadata.uid": lambda: meta.uid,
        "spec.nodeName": lambda: spec.node_name,
        "spec.serviceAccountName": lambda: spec.service_account_name,
        "status.podIP": lambda: status.pod_ip,
        "status.hostIP": lambda: status.host_ip,
        "status.podIPs": lambda: ",".join(p.ip for p in (status.pod_ips or [])),
        "status.hostIPs": lambda: ",".join(p.ip for p in (status.host_ips or [])),
    }
    if path not in simple:
        raise ValueError(f"unsupported fieldRef {path!r}")
    return simple[path]() or ""


# ----------------------------------------------------------------------------- state
@dataclass
class Proc:
    uid: str
    namespace: str
    name: str
    container: str
    image: str
    restart_policy: str
    pid: int
    popen: subprocess.Popen | None  # None when adopted from a previous agent
    started_at: str
    log_path: Path
    kill_at: float | None = None  # SIGKILL deadline once stopping
    stop_reason: str = ""  # "" = running; "deleted" / "terminal" / "shutdown"
    delete_after: bool = False
    extra: dict = field(default_factory=dict)

    def poll(self) -> int | None:
        """Exit code (128+sig for signals) or None while alive."""
        if self.popen is not None:
            rc = self.popen.poll()
            if rc is None:
                return None
            return 128 - rc if rc < 0 else rc
        if _pid_alive(self.pid):
            return None
        return 255  # adopted: exit status unknown


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pid_is_pod(pid: int, uid: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{MARKER_ENV}={uid}".encode() in env


class Agent:
    def __init__(self, api: client.ApiClient, cache: Path, podnet: PodNetwork | None = None,
                 kubernetes_service: str = ""):
        self.api = api
        self.podnet = podnet
        self.kubernetes_service = kubernetes_service  # host:port of the `kubernetes` Service
        self.pod_cidrs: dict[str, str] = {}  # node -> podCIDR
        self.core = client.CoreV1Api(api)
        self.cache = cache
        self.logs = cache / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, Proc] = {}
        self.done: set[str] = set()  # uids whose process ran and ended (never restarted)
        self.events: queue.Queue = queue.Queue()
        self.stopping = False

    # -- watching -----------------------------------------------------------------------
    def watch_loop(self) -> None:
        while not self.stopping:
            try:
                pods = self.core.list_pod_for_all_namespaces(label_selector=LABEL_SELECTOR)
                self.events.put(("LIST", pods.items))
                w = watch.Watch()
                for ev in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    label_selector=LABEL_SELECTOR,
                    resource_version=pods.metadata.resource_version,
                    timeout_seconds=60,
                ):
                    self.events.put((ev["type"], ev["object"]))
                    if self.stopping:
                        break
            except Exception as exc:
                if self.stopping:
                    return
                log.warning("watch failed (%s); relisting in 1s", exc)
                time.sleep(1)

    # -- event handling -------------------------------------------------------------------
    def handle(self, kind: str, obj) -> None:
        if kind == "LIST":
            seen = {p.metadata.uid for p in obj}
            for uid in list(self.procs):
                if uid not in seen:
                    self.stop(uid, "deleted")
            for p in obj:
                self.handle_pod(p)
            self.done &= seen
            self.release_orphans()
            return
        if kind == "DELETED":
            if obj.metadata.uid in self.procs:
                self.stop(obj.metadata.uid, "deleted")
            self.done.discard(obj.metadata.uid)
            return
        if kind in ("ADDED", "MODIFIED"):
            self.handle_pod(obj)

    def handle_pod(self, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid
        phase = pod.status.phase if pod.status else None
        proc = self.procs.get(uid)
        if pod.metadata.deletion_timestamp is not None:
            if proc is not None:
                grace = pod.metadata.deletion_grace_period_seconds
                self.stop(uid, "deleted", grace=grace, delete_after=True)
            else:  # nothing to stop: finish the deletion as a kubelet would
                self.delete_pod(pod.metadata.namespace, pod.metadata.name, uid)
            return
        if phase in ("Succeeded", "Failed"):
            if proc is not None and not proc.stop_reason:
                self.stop(uid, "terminal")
            return
        if phase != "Running" or not pod.status.pod_ip or proc is not None or uid in self.done:
            return
        ann = pod.metadata.annotations or {}
        if PID_ANNOTATION in ann:
            self.adopt(pod, int(ann[PID_ANNOTATION]))
        else:
            self.start(pod)

    # -- processes ------------------------------------------------------------------------
    def build_env(self, pod: client.V1Pod, c: client.V1Container) -> dict[str, str]:
        ns = pod.metadata.namespace
        defined: dict[str, str] = {}
        for src in c.env_from or []:
            data: dict[str, str] = {}
            try:
                if src.config_map_ref is not None:
                    data = self.core.read_namespaced_config_map(src.config_map_ref.name, ns).data or {}
                elif src.secret_ref is not None:
                    raw = self.core.read_namespaced_secret(src.secret_ref.name, ns).data or {}
                    data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
            except ApiException as exc:
                ref = src.config_map_ref or src.secret_ref
                if exc.status != 404 or not (ref and ref.optional):
                    raise
            for k, v in data.items():
                defined[(src.prefix or "") + k] = v
        for e in c.env or []:
            if e.value_from is None:
                defined[e.name] = expand(e.value or "", defined)
                continue
            vf = e.value_from
            if vf.field_ref is not None:
                defined[e.name] = _field_value(pod, vf.field_ref.field_path)
            elif vf.config_map_key_ref is not None:
                ref = vf.config_map_key_ref
                cm = self.core.read_namespaced_config_map(ref.name, ns)
                defined[e.name] = (cm.data or {})[ref.key]
            elif vf.secret_key_ref is not None:
                ref = vf.secret_key_ref
                sec = self.core.read_namespaced_secret(ref.name, ns)
                defined[e.name] = base64.b64decode((sec.data or {})[ref.key]).decode()
            else:
                raise ValueError(f"env {e.name}: unsupported valueFrom")
        env = dict(os.environ)
        # The agent runs with the project's venv python; put that venv first on PATH so a pod's
        # `python`/`rljob-operator` are the project's, as they would be in its image.
        venv_bin = str(Path(sys.executable).parent)
        if env.get("PATH", "").split(":")[0] != venv_bin:
            env["PATH"] = f"{venv_bin}:{env.get('PATH', '')}"
        if self.podnet is not None:
            # A pod in its own network reaches the API server as a real kubelet's pod does: by its
            # ServiceAccount and the `kubernetes` Service. The host's kubeconfig (the loopback
            # cluster's, when the agent was started from a shell that exported it) would win over
            # both in every client library and point at an address this network cannot reach.
            env.pop("KUBECONFIG", None)
            if self.kubernetes_service:
                host, _, port = self.kubernetes_service.rpartition(":")
                env.update({"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port})
        env.update(defined)
        env[MARKER_ENV] = pod.metadata.uid
        return env

    def start(self, pod: client.V1Pod) -> None:
        meta = pod.metadata
        c = pod.spec.containers[0]
        log_path = self.logs / f"{meta.namespace}_{meta.name}.log"
        started = now_rfc3339()
        try:
            env = self.build_env(pod, c)
            container_env = {k: v for k, v in env.items() if k not in os.environ or k == MARKER_ENV}
            argv = [expand(a, container_env) for a in (c.command or []) + (c.args or [])]
            if not argv:
                raise ValueError("container has neither command nor args")
            if self.podnet is not None:
                node, hostname = pod.spec.node_name, pod.spec.hostname or meta.name
                netns = self.podnet.setup(meta.uid, meta.namespace, pod.status.pod_ip,
                                          self.pod_cidr(node), node, hostname, pod.spec.subdomain or "")
                argv = wrap(argv, netns, hostname, self.service_account(pod))
            with open(log_path, "ab") as logf:  # the child keeps its own copy of the fd
                popen = subprocess.Popen(
                    argv, env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                    stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                )
        except Exception as exc:  # cannot start: the pod fails like a container that can't
            log.warning("%s/%s: cannot start: %s", meta.namespace, meta.name, exc)
            with open(log_path, "a") as f:
                f.write(f"[testcluster-agent] cannot start: {exc}\n")
            self.release(meta.uid)
            self.done.add(meta.uid)
            self.report_exit(meta.namespace, meta.name, meta.uid, c.name, c.image, 128, started,
                             "StartError", str(exc)[:1000], phase="Failed")
            return
        proc = Proc(meta.uid, meta.namespace, meta.name, c.name, c.image or "",
                    pod.spec.restart_policy or "Always", popen.pid, popen, started, log_path)
        self.procs[meta.uid] = proc
        log.info("%s/%s: started pid %d: %s", meta.namespace, meta.name, popen.pid, argv)
        try:
            self.core.patch_namespaced_pod(
                meta.name, meta.namespace,
                {"metadata": {"annotations": {PID_ANNOTATION: str(popen.pid)}}},
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def adopt(self, pod: client.V1Pod, pid: int) -> None:
        meta = pod.metadata
        c = pod.spec.containers[0]
        log_path = self.logs / f"{meta.namespace}_{meta.name}.log"
        started = now_rfc3339()
        for cs in pod.status.container_statuses or []:
            if cs.name == c.name and cs.state and cs.state.running and cs.state.running.started_at:
                started = cs.state.running.started_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        if _pid_alive(pid) and _pid_is_pod(pid, meta.uid):
            self.procs[meta.uid] = Proc(meta.uid, meta.namespace, meta.name, c.name, c.image or "",
                                        pod.spec.restart_policy or "Always", pid, None, started,
                                        log_path)
            log.info("%s/%s: adopted pid %d", meta.namespace, meta.name, pid)
            return
        log.info("%s/%s: pid %d is gone; marking Failed", meta.namespace, meta.name, pid)
        self.release(meta.uid)
        self.done.add(meta.uid)
        self.report_exit(meta.namespace, meta.name, meta.uid, c.name, c.image, 255, started,
                         "ProcessExited", "process ended while the agent was not running "
                         "(exit status unknown)", phase="Failed")

    def stop(self, uid: str, reason: str, grace: int | None = None, delete_after: bool = False) -> None:
        proc = self.procs.get(uid)
        if proc is None:
            return
        proc.delete_after = proc.delete_after or delete_after
        if proc.stop_reason:
            return
        proc.stop_reason = reason
        kill_after = KILL_AFTER_S if grace is None else max(0.0, min(KILL_AFTER_S, float(grace)))
        proc.kill_at = time.monotonic() + kill_after
        log.info("%s/%s: stopping pid %d (%s)", proc.namespace, proc.name, proc.pid, reason)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)

    def check_processes(self) -> None:
        for uid, proc in list(self.procs.items()):
            rc = proc.poll()
            if rc is None:
                if proc.kill_at is not None and time.monotonic() >= proc.kill_at:
                    log.info("%s/%s: SIGKILL pid %d", proc.namespace, proc.name, proc.pid)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.kill_at = None
                continue
            # The main process is gone: like a container, nothing of its group survives it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            del self.procs[uid]
            self.release(uid)
            self.done.add(uid)
            log.info("%s/%s: pid %d exited with %d (%s)", proc.namespace, proc.name, proc.pid, rc,
                     proc.stop_reason or "by itself")
            if proc.delete_after:
                self.delete_pod(proc.namespace, proc.name, uid)
            elif not proc.stop_reason:
                ok = rc == 0 and proc.restart_policy != "Always"
                self.report_exit(
                    proc.namespace, proc.name, uid, proc.container, proc.image, rc, proc.started_at,
                    "Completed" if ok else "ProcessExited", self._tail(proc.log_path),
                    phase="Succeeded" if ok else "Failed",
                )

    # -- pod networks ---------------------------------------------------------------------
    def pod_cidr(self, node: str) -> str:
        if node not in self.pod_cidrs:
            spec = self.core.read_node(node).spec
            cidr = spec.pod_cidr or (spec.pod_cid_rs or [None])[0]
            if not cidr:
                raise ValueError(f"node {node} has no podCIDR")
            self.pod_cidrs[node] = cidr
        return self.pod_cidrs[node]

    def service_account(self, pod: client.V1Pod) -> Path | None:
        """The pod's projected ServiceAccount files (None when it opts out of automounting)."""
        assert self.podnet is not None
        if pod.spec.automount_service_account_token is False:
            return None
        meta = pod.metadata
        req = self.core.create_namespaced_service_account_token(
            pod.spec.service_account_name or "default", meta.namespace,
            {"spec": {"expirationSeconds": TOKEN_SECONDS,
                      "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta.name, "uid": meta.uid}}},
        )
        ca = Path(self.api.configuration.ssl_ca_cert).read_bytes()
        return self.podnet.project_service_account(meta.uid, meta.namespace, req.status.token, ca)

    def release(self, uid: str) -> None:
        """Delete the pod's network namespace once nothing runs in it (no-op without podnet)."""
        if self.podnet is None:
            return
        try:
            self.podnet.teardown(uid)
        except Exception as exc:  # the namespace is deleted regardless; the address may leak
            log.warning("pod %s: network teardown: %s", uid, exc)

    def release_orphans(self) -> None:
        """Networks of pods whose process ended while no agent was running."""
        if self.podnet is None:
            return
        for path in (self.podnet.state / "pods").glob("*.json"):
            if path.stem not in self.procs:
                self.release(path.stem)

    @staticmethod
    def _tail(path: Path, limit: int = 1500) -> str:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    # -- API writes -----------------------------------------------------------------------
    def report_exit(self, ns: str, name: str, uid: str, container: str, image: str | None, rc: int,
                    started: str, reason: str, message: str, phase: str) -> None:
        now = now_rfc3339()
        cond_reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        body = {
            "metadata": {"uid": uid},  # precondition: never touch a newer pod of the same name
            "status": {
                "phase": phase,
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": cond_reason, "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "False", "reason": cond_reason,
                     "lastTransitionTime": now},
                ],
                "containerStatuses": [{
                    "name": container,
                    "image": image or "",
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {
                        "running": None,
                        "waiting": None,
                        "terminated": {
                            "exitCode": rc, "reason": reason, "message": message,
                            "startedAt": started, "finishedAt": now,
                        },
                    },
                }],
            },
        }
        try:
            self.core.patch_namespaced_pod_status(name, ns, body)
            log.info("%s/%s: marked %s (exit %d, %s)", ns, name, phase, rc, reason)
        except ApiException as exc:
            if exc.status not in (404, 409, 422):
                raise
            log.info("%s/%s: status not written (%s)", ns, name, exc.status)

    def delete_pod(self, ns: str, name: str, uid: str) -> None:
        try:
            self.core.delete_namespaced_pod(
                name, ns, body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)),
            )
            log.info("%s/%s: deleted", ns, name)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    # -- main loop ------------------------------------------------------------------------
    def run(self, ready_file: Path | None) -> None:
        t = threading.Thread(target=self.watch_loop, daemon=True, name="watch")
        t.start()
        ready = False
        while not self.stopping:
            try:
                kind, obj = self.events.get(timeout=0.2)
            except queue.Empty:
                kind = None
            try:
                if kind is not None:
                    self.handle(kind, obj)
                    if kind == "LIST" and not ready and ready_file is not None:
                        ready_file.write_text(f"{os.getpid()}\n")
                        ready = True
                self.check_processes()
            except Exception:
                log.exception("error handling %s", kind)
        self.shutdown()

    def shutdown(self) -> None:
        for uid in list(self.procs):
            self.stop(uid, "shutdown")
        deadline = time.monotonic() + KILL_AFTER_S + 2
        while self.procs and time.monotonic() < deadline:
            for uid, proc in list(self.procs.items()):
                if proc.poll() is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    del self.procs[uid]
                    self.release(uid)
                elif proc.kill_at is not None and time.monotonic() >= proc.kill_at:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.kill_at = None
            time.sleep(0.1)
        if self.podnet is not None and not self.procs:  # a process left alive keeps its network
            self.podnet.teardown_all()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    default_cache = os.environ.get("RLJOB_TESTCLUSTER_CACHE", str(Path.home() / ".cache/rljob-testcluster"))
    ap.add_argument("--cache", default=default_cache)
    ap.add_argument("--kubeconfig", default=None)
    ap.add_argument("--ready-file", default=None)
    ap.add_argument("--podnet-cni-bin", default=None,
                    help="run each process in a network namespace of its pod's own (CNI plugins here)")
    ap.add_argument("--podnet-dns", default="", help="the cluster DNS address for the pods' resolv.conf")
    ap.add_argument("--podnet-prefix", default="", help="prefix of the pods' network namespace names")
    ap.add_argument("--podnet-kubernetes", default="", help="host:port of the `kubernetes` Service, for pods")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(message)s")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    # One agent per cache dir, in a session of its own (not killed with the shell that started it).
    lock = open(cache / "agent.lock", "w")  # held (locked) for the life of the process
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log.error("another agent holds %s; exiting", cache / "agent.lock")
        return 1
    with contextlib.suppress(PermissionError):
        os.setsid()
    kubeconfig = args.kubeconfig or str(cache / "kubeconfig")
    api = config.new_client_from_config(config_file=kubeconfig)
    podnet = None
    if args.podnet_cni_bin:
        podnet = PodNetwork(Path(args.podnet_cni_bin), cache / "podnet", args.podnet_prefix,
                            args.podnet_dns)
    agent = Agent(api, cache, podnet, args.podnet_kubernetes)

    def on_signal(signum, _frame):
        log.info("signal %d: stopping all processes", signum)
        agent.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ready_file = Path(args.ready_file) if args.ready_file else None
    try:
        agent.run(ready_file)
    finally:
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)
    log.info("agent stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
