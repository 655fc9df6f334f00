"""Helpers of the operator's cluster tests: the operator as a subprocess, test RLJobs, the
controller API from the trainer's side. Real parts only: a real kube-apiserver, the real
`rljob-operator` console script, real engine processes run by the test cluster's agent."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

import yaml

from controller_runtime.engine_extensions import WEIGHT_TRANSFER_EXTENSION
from tests.cluster.fixtures import wait_for  # one polling helper for every cluster test
from tests.fixtures.process_logs import register, tail

REPO = Path(__file__).resolve().parents[2]
STANDIN_DIR = REPO / "tests" / "engine_standin"
CRD_FILE = REPO / "crds" / "rljob.yaml"
EXAMPLE = REPO / "examples" / "llama-8b-8gpu.yaml"
OPERATOR_BIN = REPO / ".venv" / "bin" / "rljob-operator"
PROCESS_LABEL = "testcluster.rljob.io/run"
PID_ANNOTATION = "testcluster.rljob.io/pid"
CONTROL_PREFIX = "/apis/control.rljob.io/v1alpha1"

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_crd(cluster: Any) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=rljob-operator-test", "-f", str(CRD_FILE))
    cluster.wait_established("rljobs.rljob.io")
    wait_for(lambda: cluster.kubectl("get", "rlj", "-A", check=False).returncode == 0, 60, what="kubectl get rlj")


class OperatorProcess:
    """`rljob-operator --namespace NS` as a subprocess with the test kubeconfig, loopback ports."""

    def __init__(self, cluster: Any, namespace: str, log_dir: Path, identity: str = "op-a", resync: float = 2.0,
                 kubeconfig: Path | None = None, extra_args: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.namespace = namespace
        self.identity = identity
        self.api_port = free_port()
        self.metrics_port = free_port()
        self.log_path = log_dir / f"operator-{identity}-{int(time.time() * 1000)}.log"
        argv = [
            str(OPERATOR_BIN),
            "--namespace", namespace,
            "--kubeconfig", str(kubeconfig or cluster.kubeconfig),
            "--controller-api-host", "127.0.0.1",
            "--controller-api-port", str(self.api_port),
            "--metrics-host", "127.0.0.1",
            "--metrics-port", str(self.metrics_port),
            "--identity", identity,
            "--lease-namespace", namespace,
            "--lease-duration", "6",
            "--renew-deadline", "4",
            "--retry-period", "1",
            "--resync", str(resync),
            "--controller-url", f"http://127.0.0.1:{self.api_port}",
            "--auth-cache", "0",
            "--log-format", "text",
            *extra_args,
        ]  # fmt: skip
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        register(f"operator {identity}", self.log_path)
        wait_for(lambda: self.healthz() is not None, 60, what=f"operator {identity} /healthz")

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def healthz(self) -> dict[str, Any] | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"operator {self.identity} exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2) as r:
                return json.loads(r.read())
        except (OSError, urllib.error.URLError):
            return None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def is_leader(self) -> bool:
        h = self.healthz()
        return bool(h and h.get("detail") == "leader")

    def log_tail(self, n: int = 60) -> str:
        return tail(self.log_path, n)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode


def make_rljob(
    name: str,
    *,
    replicas: int = 4,
    standin_cells: str = "all",
    crash_cells: str = "",
    gate_dir: Path | None = None,
    model_path: Path | None = None,
    max_restarts: int = 2,
    backoff: float = 0.5,
    max_backoff: float = 2,
    startup_deadline: float = 120,
    lock_timeout: float | None = None,
    trainer_job: bool = False,
    ttl_after_finished: int | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """examples/llama-8b-8gpu.yaml adjusted to the test cluster.

    Kept: the engine (vLLM), 2-GPU cells on the simulated H100 nodes with their toleration,
    the trainer's placement. Changed: no PVCs (the test cluster has no storage), the tiny model
    from a local path, tensor parallel 1 and CPU engine args (the agent runs real processes on
    this CPU machine), 1 s health checks, a small restart budget, engine pods labelled for the
    process agent, the trainer as a workloadRef (kwok would "complete" trainer pods at once),
    and test-only env that makes some cells light stand-ins (tests/engine_standin).
    """
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"] = {"name": name}
    spec = job["spec"]
    spec["model"] = {"path": str(model_path or "/models/tiny")}
    inf = spec["inference"]
    inf["replicas"] = replicas
    inf["tensorParallelSize"] = 1
    # The simulated GPU cells run vLLM on this CPU: load the worker extension, which asks for the
    # AMX state vLLM's CPU attention needs (`vllm_worker_extension.allow_amx`; the operator loads
    # it by itself only into CPU engines, gpusPerEngine 0).
    inf["engineArgs"] = ["--dtype=bfloat16", "--max-model-len=512", "--enforce-eager",
                         f"--worker-extension-cls={WEIGHT_TRANSFER_EXTENSION}"]  # fmt: skip
    inf["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    env = {
        # The agent runs the pod's `python -m vllm...` with its own PATH; make it the venv's.
        "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(STANDIN_DIR),
        "RLJOB_STANDIN_CELLS": standin_cells,
        "RLJOB_CRASH_CELLS": crash_cells,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        **({"RLJOB_STANDIN_GATE": str(gate_dir)} if gate_dir else {}),
        **(extra_env or {}),
    }
    inf["env"] = [{"name": k, "value": v} for k, v in env.items()]
    inf["podMetadata"] = {"labels": {PROCESS_LABEL: "process"}}
    inf["healthCheck"] = {"intervalSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2,
                          "startupDeadlineSeconds": startup_deadline}
    inf["restartPolicy"] = {"backoffSeconds": backoff, "maxBackoffSeconds": max_backoff, "maxRestarts": max_restarts}
    wu = inf["weightUpdate"]
    wu.pop("pvc", None)
    if lock_timeout is not None:
        wu["lockTimeoutSeconds"] = lock_timeout
    ro = spec["rollout"]
    ro["dataset"] = {"path": "examples/data/tiny-prompts.jsonl", "labelField": None}
    ro.pop("resources", None)
    tr = spec["trainer"]
    if trainer_job:  # the operator's trainer Job; kwok completes its (simulated) pods at once
        tr.update(replicas=1, gpusPerReplica=0)
        tr.pop("resources", None)
    else:
        spec["trainer"] = {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": f"{name}-my-trainer"},
                           "serviceAccountName": tr.get("serviceAccountName", "rljob-trainer")}
    if ttl_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = ttl_after_finished
    return copy.deepcopy(job)


class Kube:
    """kubectl against the test cluster, JSON in and out."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace

    def apply(self, obj: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(obj))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        r = self.cluster.kubectl("get", kind, name, "-n", self.ns, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def rljob(self, name: str) -> dict[str, Any]:
        obj = self.get("rljob", name)
        assert obj is not None, f"rljob {name} not found"
        return obj

    def status(self, name: str) -> dict[str, Any]:
        return self.rljob(name).get("status") or {}

    def pods(self, selector: str) -> list[dict[str, Any]]:
        r = self.cluster.kubectl("get", "pods", "-n", self.ns, "-l", selector, "-o", "json")
        return json.loads(r.stdout)["items"]

    def engine_pods(self, job: str) -> list[dict[str, Any]]:
        return self.pods(f"rljob.io/job={job},rljob.io/role=engine")

    def events(self, job: str) -> list[dict[str, Any]]:
        r = self.cluster.kubectl("get", "events", "-n", self.ns, "--field-selector",
                                 f"involvedObject.name={job},involvedObject.kind=RLJob", "-o", "json")
        return json.loads(r.stdout)["items"]

    def printer_columns(self, name: str) -> dict[str, str]:
        """`kubectl get rlj NAME` as a person sees it: the CRD's printer columns by header."""
        lines = self.cluster.kubectl("get", "rlj", name, "-n", self.ns).stdout.splitlines()
        header, row = lines[0].split(), lines[1].split()
        return dict(zip(header, row, strict=False))

    def token(self, service_account: str) -> str:
        return self.cluster.kubectl("create", "token", service_account, "-n", self.ns).stdout.strip()


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in status.get("conditions") or []:
        if c.get("type") == type_:
            return c
    return {}


def engine_states(status: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["state"] for e in status.get("engines") or []}


def call(api: str, namespace: str, job: str, verb: str, body: dict[str, Any] | None = None,
         token: str | None = None, timeout: float = 120) -> tuple[int, dict[str, Any], dict[str, str]]:
    """One controller API call as the trainer makes it; (status, JSON body, headers)."""
    url = f"{api}{CONTROL_PREFIX}/namespaces/{namespace}/rljobs/{job}/{verb}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            parsed = json.loads(raw or b"{}")
        except ValueError:
            parsed = {"raw": raw.decode(errors="replace")}
        return e.code, parsed, dict(e.headers)


def control_rbac(kube: Kube, job: str) -> tuple[str, str]:
    """ServiceAccounts `trainer` (bound to update rljobs/control of `job`) and `nobody`; their tokens."""
    ns = kube.ns
    for sa in ("trainer", "nobody"):
        kube.cluster.kubectl("create", "serviceaccount", sa, "-n", ns, check=False)
    kube.apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "rljob-control", "namespace": ns},
        "rules": [{"apiGroups": ["rljob.io"], "resources": ["rljobs/control"], "verbs": ["update"], "resourceNames": [job]}],
    })
    kube.apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "trainer-control", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rljob-control"},
        "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": ns}],
    })
    return kube.token("trainer"), kube.token("nobody")


def release_rljobs(cluster: Any, namespace: str) -> None:
    """After the operators stopped: drop the operator's finalizer so the test namespace can go."""
    r = cluster.kubectl("get", "rlj", "-n", namespace, "-o", "name", check=False)
    for ref in r.stdout.split():
        cluster.kubectl("patch", ref, "-n", namespace, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
