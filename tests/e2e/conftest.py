"""Fixtures of the end-to-end tier: the operator installed by `helm install` on the test cluster.

What makes the chart runnable on the test cluster (and nowhere else) is only values:
- `podLabels: {testcluster.rljob.io/run: process}`: the cluster's process agent runs each
  operator pod as a real local `rljob-operator` process (the venv is on its PATH);
- `bindAddress: $(POD_IP)`: every pod shares the host's loopback, so each binds its own
  127.x pod IP instead of 0.0.0.0;
- `extraArgs: [--kubeconfig=...]`: an agent-run process has no projected ServiceAccount
  token, so the test mints one for the chart's ServiceAccount (`kubectl create token`) and
  writes a kubeconfig around it. The operator therefore talks to the API server *as the
  chart's ServiceAccount*: the chart's RBAC is what is tested, not an admin certificate.
  The ServiceAccount must exist before its token; it is created first with Helm's ownership
  label and annotations, so `helm install` adopts it (Helm >= 3.2) and `helm uninstall`
  deletes it like any other object of the release.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.fixtures import Cluster, wait_for
from tests.cluster.kuberay import KubeRayProcess, kuberay_dir

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "rljob-operator"
CRD = REPO / "crds" / "rljob.yaml"
PROCESS_LABEL = "testcluster.rljob.io/run"
PID_ANNOTATION = "testcluster.rljob.io/pid"
LEASE_NAME = "rljob-operator-leader"
VENV_BIN = Path(sys.executable).parent  # the venv the tests run in; its console scripts and python
API_PORT = 8080
METRICS_PORT = 9090


@pytest.fixture(scope="session")
def rljob_crd(cluster: Cluster) -> Path:
    """The CRD of this working tree, applied the way the README tells users to before `helm upgrade`."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    cluster.wait_established("rljobs.rljob.io")
    return CRD


def sa_kubeconfig(cluster: Cluster, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a bound token, 2 h), same server and CA."""
    token = cluster.kubectl("-n", namespace, "create", "token", service_account, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ctx_name = admin["current-context"]
    ctx = next(c["context"] for c in admin["contexts"] if c["name"] == ctx_name)
    server = next(c["cluster"] for c in admin["clusters"] if c["name"] == ctx["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": server}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": service_account, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class OperatorRelease:
    """One `helm install` of the chart; names and the little queries the tests repeat."""

    cluster: Cluster
    name: str
    namespace: str
    values_file: Path
    installed: bool = True
    install_output: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/instance={self.name}"

    def helm(self, *args: str, check: bool = True, timeout: float = 300):
        return self.cluster.helm(*args, "-n", self.namespace, check=check, timeout=timeout)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None):
        return self.cluster.kubectl("-n", self.namespace, *args, check=check, input=input)

    def pods(self) -> list[dict[str, Any]]:
        """The release's operator pods that are not being deleted."""
        out = self.kubectl("get", "pods", "-l", self.selector, "-o", "json").stdout
        return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]

    def running_pods(self, count: int) -> list[dict[str, Any]] | None:
        """`count` Running pods, each with its process started (pid annotation), else None."""
        pods = self.pods()
        running = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")
                   and PID_ANNOTATION in (p["metadata"].get("annotations") or {})]
        return running if len(running) == count and len(pods) == count else None

    def lease_holder(self) -> str:
        res = self.kubectl("get", "lease", LEASE_NAME, "-o", "jsonpath={.spec.holderIdentity}", check=False)
        return res.stdout.strip() if res.returncode == 0 else ""

    def wait_leader(self, pods: list[dict[str, Any]], timeout: float = 60) -> dict[str, Any]:
        """The pod among `pods` that holds the Lease."""
        names = {p["metadata"]["name"]: p for p in pods}
        holder = wait_for(lambda: self.lease_holder() in names and self.lease_holder(), timeout=timeout,
                          what=f"Lease {LEASE_NAME} held by one of {sorted(names)}")
        return names[holder]

    def uninstall(self) -> str:
        self.installed = False
        return self.helm("uninstall", self.name, "--wait", "--timeout", "120s").stdout


def venv_path_env() -> dict[str, str]:
    """PATH with this venv first, for processes the agent runs.

    The agent passes its own environment on, so the venv is on PATH only when whoever ran
    `tests/cluster/up` had it there; `rljob-operator` and the engines' `python` must resolve
    to this venv either way.
    """
    return {"name": "PATH", "value": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"}


def operator_values(namespace: str, kubeconfig: Path, **overrides: Any) -> dict[str, Any]:
    """Values that make the chart runnable on the test cluster (see the module docstring)."""
    values: dict[str, Any] = {
        "podLabels": {PROCESS_LABEL: "process"},
        "bindAddress": "$(POD_IP)",
        "scope": "namespace",
        "watchNamespaces": [namespace],
        "extraArgs": [f"--kubeconfig={kubeconfig}", "--log-format=text"],
        "extraEnv": [venv_path_env()],
        "controllerApi": {"port": API_PORT},
        "metrics": {"port": METRICS_PORT},
    }
    values.update(overrides)
    return values


def delete_rljobs(cluster: Cluster, namespace: str) -> None:
    """Delete the namespace's RLJobs while the operator still runs (it removes their finalizer).

    Without this, uninstalling first would leave RLJobs whose finalizer nobody removes, and
    the namespace would hang in Terminating; if the operator is gone already, the finalizer
    is dropped by hand as a last resort (the test then fails on its own assertions, not here).
    """
    res = cluster.kubectl("-n", namespace, "delete", "rljobs", "--all", "--timeout=60s", check=False)
    if res.returncode == 0:
        return
    names = cluster.kubectl("-n", namespace, "get", "rljobs", "-o", "name", check=False).stdout.split()
    for obj in names:
        cluster.kubectl("-n", namespace, "patch", obj, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                        check=False)


def install_operator(cluster: Cluster, namespace: str, workdir: Path, **overrides: Any) -> OperatorRelease:
    """helm install the chart into `namespace`, running as its own ServiceAccount (see module docstring)."""
    name = f"rljob-operator-{uuid.uuid4().hex[:5]}"  # cluster-scoped RBAC names must not collide
    sa = name  # the chart's fullname: the release name already contains the chart name
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": sa,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": name, "meta.helm.sh/release-namespace": namespace},
        },
    }))
    kubeconfig = sa_kubeconfig(cluster, namespace, sa, workdir / f"{name}.kubeconfig")
    values_file = workdir / f"{name}-values.yaml"
    values_file.write_text(yaml.safe_dump(operator_values(namespace, kubeconfig, **overrides)))
    res = cluster.helm("install", name, str(CHART), "-n", namespace, "-f", str(values_file),
                       "--wait", "--timeout", "180s")
    return OperatorRelease(cluster, name, namespace, values_file, install_output=res.stdout)


@pytest.fixture
def operator(cluster: Cluster, namespace: str, rljob_crd: Path, tmp_path: Path) -> Iterator[OperatorRelease]:
    """The chart installed into a fresh namespace, watching only that namespace; removed afterwards."""
    release = install_operator(cluster, namespace, tmp_path)
    try:
        yield release
    finally:
        delete_rljobs(cluster, namespace)
        if release.installed:
            release.helm("uninstall", release.name, "--wait", "--timeout", "120s", check=False)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kjson(c: Cluster, ns: str, *what: str) -> Any:
    return json.loads(c.kubectl("-n", ns, "get", *what, "-o", "json").stdout)


@pytest.fixture
def loop_ns(podnet_cluster: Cluster, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(namespace, helm release) on the pod-network cluster: the operator installed as the README
    tells users, in-cluster, watching that namespace."""
    c = podnet_cluster
    ns = c.create_namespace(f"t-loop-{uuid.uuid4().hex[:6]}")
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    c.wait_established("rljobs.rljob.io")
    release = f"rljob-operator-{uuid.uuid4().hex[:5]}"
    values = {
        "podLabels": {PROCESS_LABEL: "process"},
        "replicaCount": 1,
        "scope": "namespace",
        "watchNamespaces": [ns],
        "extraArgs": ["--log-format=text"],
        "extraEnv": [venv_path_env()],
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    c.helm(
        "install",
        release,
        str(CHART),
        "-n",
        ns,
        "-f",
        str(tmp_path / "values.yaml"),
        "--wait",
        "--timeout",
        "180s",
    )
    try:
        yield ns, release
    finally:
        c.kubectl("-n", ns, "delete", "rljobs", "--all", "--timeout=60s", check=False)
        c.helm("uninstall", release, "-n", ns, "--wait", "--timeout", "120s", check=False)
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def control_service_account(c: Cluster, ns: str, release: str, sa: str) -> None:
    """`sa`, bound to the chart's `<release>-control` ClusterRole (what the README asks of a trainer's)."""
    c.kubectl("-n", ns, "create", "serviceaccount", sa)
    c.kubectl("-n", ns, "create", "rolebinding", f"{sa}-control", f"--clusterrole={release}-control",
              f"--serviceaccount={ns}:{sa}")  # fmt: skip


@pytest.fixture(scope="session")
def kuberay(podnet_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeRayProcess]:
    """The real KubeRay operator (v1.5.0, tests/cluster/kuberay.py) on the pod-network cluster,
    watching every namespace, once per session. `tests/cluster/up` builds it, so a missing
    build is a failure, not a skip."""
    build = kuberay_dir()
    if build is None:
        pytest.fail("KubeRay is not built: tests/cluster/build --print-kuberay failed (tests/cluster/build builds it)")
    proc = KubeRayProcess(podnet_cluster, build, tmp_path_factory.mktemp("kuberay") / "kuberay.log")
    try:
        yield proc
    finally:
        proc.stop()
