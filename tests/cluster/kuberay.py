"""The real KubeRay operator (ray-operator v1.5.0) as a process against a test cluster.

Built from github.com/ray-project/kuberay/ray-operator by `tests/cluster/build` under its own
cache key (`--print-kuberay` prints `<cache>/kuberay-<version>` with `bin/ray-operator` and
`crds/`). Used by the e2e test of `spec.rollout.rayCluster` (tests/e2e/test_kuberay_rollout.py)
and by the benchmarks that run KubeRay beside the operator, so it imports no pytest.

How it is run: with the test kubeconfig, leader election off (one process), its metrics and
health probe on loopback ports of its own, and either every namespace or a list of them
(`--watch-namespace`). On a cluster with pod networking the API server is on 127.0.0.1 of the
cluster's network namespace, so the process runs there (`cluster.in_netns`), as kube-proxy
and the agent do, and its ports are probed from there too.

CRDs: the manager starts RayCluster, RayJob and RayService controllers and exits when a kind
is unknown, so the RayJob and RayService CRDs of the same module zip are installed when the
cluster lacks them. The RayCluster CRD is the one `tests/cluster/up` installs (newer than
v1.5.0, shared by the whole suite); it is kept, but only after checking that it has every
field of v1.5.0's own CRD (`missing_fields`), so nothing KubeRay v1.5.0 writes is pruned.
CRDs installed here are deleted again by `stop()`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import yaml

from tests.cluster.procs import stop_group
from tests.cluster.waiting import wait_for

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"
CRD_FILES = {
    "rayclusters.ray.io": "ray.io_rayclusters.yaml",
    "rayjobs.ray.io": "ray.io_rayjobs.yaml",
    "rayservices.ray.io": "ray.io_rayservices.yaml",
}
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are ~1 MB each


class KubectlCluster(Protocol):
    """What the harness needs of a cluster (tests.cluster.fixtures.Cluster has it)."""

    kubeconfig: Path

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = ...
    ) -> subprocess.CompletedProcess[str]: ...

    def in_netns(self, argv: list[str]) -> list[str]: ...


def kuberay_dir(env: dict[str, str] | None = None) -> Path | None:
    """KubeRay's build (bin/ray-operator, crds/), or None when it is not built."""
    r = subprocess.run([str(BUILD), "--print-kuberay"], capture_output=True, text=True, check=False, env=env)
    return Path(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else None


def _schema(crd: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    v = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
    return schema


def _paths(node: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name, sub in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}"
        yield path
        yield from _paths(sub, path)
    if isinstance(node.get("items"), dict):
        yield from _paths(node["items"], prefix + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _paths(node["additionalProperties"], prefix + "{}")


def missing_fields(installed: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """Field paths of CRD `wanted` that CRD `installed` lacks (the API server would prune them)."""
    have = set(_paths(_schema(installed)))
    return sorted(p for p in _paths(_schema(wanted)) if p not in have)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KubeRayProcess:
    """`ray-operator` running against `cluster`; `stop()` ends it and removes the CRDs it added."""

    def __init__(
        self,
        cluster: KubectlCluster,
        build: Path,
        log_path: Path,
        *,
        namespaces: tuple[str, ...] = (),
        extra_args: tuple[str, ...] = (),
        ready_timeout: float = 120,
    ) -> None:
        self.cluster = cluster
        self.log_path = log_path
        self._added_crds: list[str] = []
        self.ensure_crds(build / "crds")
        self.metrics_port, self.health_port = _free_port(), _free_port()
        argv = [
            str(build / "bin" / "ray-operator"),
            f"--kubeconfig={cluster.kubeconfig}",
            "--enable-leader-election=false",
            f"--metrics-addr=127.0.0.1:{self.metrics_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            "--log-stdout-encoder=console",
            *([f"--watch-namespace={','.join(namespaces)}"] if namespaces else []),
            *extra_args,
        ]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                cluster.in_netns(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_for(lambda: self.proc.poll() is not None or self.ready(), ready_timeout, interval=0.5,
                     what="KubeRay /readyz")  # fmt: skip
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray-operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    def ensure_crds(self, crds: Path) -> None:
        """Install what KubeRay needs and the cluster lacks; refuse an incompatible RayCluster CRD."""
        for name, file in CRD_FILES.items():
            got = self.cluster.kubectl("get", "crd", name, "-o", "yaml", check=False)
            if got.returncode == 0:
                wanted = yaml.load((crds / file).read_text(), Loader=_YAML_LOADER)
                missing = missing_fields(yaml.load(got.stdout, Loader=_YAML_LOADER), wanted)
                if missing:
                    raise RuntimeError(
                        f"the cluster's CRD {name} lacks {len(missing)} field(s) of KubeRay's own "
                        f"{crds / file} (the API server would prune them), e.g. {missing[:5]}"
                    )
                continue
            self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds / file))
            self._added_crds.append(name)
        self.cluster.wait_established(*CRD_FILES)

    def _get(self, port: int, path: str) -> tuple[int, str]:
        """(status, body) of GET 127.0.0.1:<port><path>, asked from where the process listens."""
        code = (
            "import json, urllib.request\n"
            "try:\n"
            f"    r = urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=5)\n"
            "    print(json.dumps([r.status, r.read().decode()]))\n"
            "except OSError as e:\n"
            "    print(json.dumps([getattr(e, 'code', 0), '']))\n"
        )
        r = subprocess.run(
            self.cluster.in_netns([sys.executable, "-c", code]), capture_output=True, text=True, timeout=30
        )
        status, body = json.loads(r.stdout or '[0, ""]')
        return int(status), str(body)

    def ready(self) -> bool:
        return self._get(self.health_port, "/readyz")[0] == 200

    def metrics(self) -> str:
        """The operator's own /metrics (controller-runtime's: reconcile counts, work queues)."""
        return self._get(self.metrics_port, "/metrics")[1]

    def log_tail(self, n: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self) -> None:
        stop_group(self.proc)
        for name in reversed(self._added_crds):
            self.cluster.kubectl("delete", "crd", name, "--ignore-not-found", "--wait=false", check=False)
        self._added_crds = []
