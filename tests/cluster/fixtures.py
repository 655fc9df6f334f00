"""pytest plugin for the test cluster (loaded by tests/conftest.py).

Fixtures:
  cluster    (session) a `Cluster`: reuses a running test cluster (kubeconfig exists and
             `kubectl version` answers, agent running), otherwise runs tests/cluster/up once
             per session, before the first test (so a cold build is not cut by per-test
             timeouts). If the binaries cannot be built (no Go toolchain, build error) the
             tests skip with the reason; under CI=true they fail instead.
  namespace  (function) a fresh namespace with its default ServiceAccount, deleted afterwards.
  podnet_cluster  (session) a `Cluster` with real pod networking (RLJOB_TESTCLUSTER_PODNET=1):
             the session's cluster when that one has it, else a second cluster of its own
             (name <name>-pn, cache <cache>/podnet sharing the built binaries), brought up once
             and deleted at the end of the session. Its API server listens on 127.0.0.1 of
             the cluster's network namespace, so `.kubectl` runs kubectl there (ip netns exec).

Tests that use `cluster` or `podnet_cluster` get the `cluster` marker automatically.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.waiting import WaitTimeout as WaitTimeout  # re-exported: tests import it from here
from tests.cluster.waiting import wait_for

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]


def cache_dir() -> Path:
    return Path(os.environ.get("RLJOB_TESTCLUSTER_CACHE", str(Path.home() / ".cache/rljob-testcluster")))


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass
class Cluster:
    kubeconfig: Path
    bin_dir: Path
    cache: Path
    name: str = os.environ.get("RLJOB_TESTCLUSTER_NAME", "rljob-test")
    netns: str | None = None  # the cluster's network namespace (pod networking), else None

    def in_netns(self, argv: list[str]) -> list[str]:
        """argv run where the cluster's addresses exist (as is when this process is there)."""
        if self.netns is None or inside_netns(self.netns):
            return argv
        return ["ip", "netns", "exec", self.netns, *argv]

    @property
    def component_dir(self) -> Path:
        """Where kwokctl put the control-plane binaries it runs (argv[0] of those processes)."""
        return self.cache / "kwok" / "clusters" / self.name / "bin"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        helm_home = self.cache / "helm"
        env.setdefault("HELM_CACHE_HOME", str(helm_home / "cache"))
        env.setdefault("HELM_CONFIG_HOME", str(helm_home / "config"))
        env.setdefault("HELM_DATA_HOME", str(helm_home / "data"))
        return env

    def _run(self, argv: list[str], check: bool, input: str | None, timeout: float) -> subprocess.CompletedProcess:
        res = subprocess.run(argv, input=input, capture_output=True, text=True, env=self._env(),
                             cwd=REPO_ROOT, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> exit {res.returncode}\nstdout: {res.stdout}\n"
                                 f"stderr: {res.stderr}")
        return res

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
        argv = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        return self._run(self.in_netns(argv), check, input, timeout)

    def helm(self, *args: str, check: bool = True, input: str | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
        argv = [str(self.bin_dir / "helm"), "--kubeconfig", str(self.kubeconfig), *args]
        return self._run(self.in_netns(argv), check, input, timeout)

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        """Poll each CRD's Established condition until True. Not `kubectl wait`: on a CRD whose
        status has no conditions yet (just created) it fails at once (".status.conditions
        accessor error: <nil> is of the type <nil>") instead of waiting."""
        jsonpath = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'

        def established(name: str) -> bool:
            return self.kubectl("get", "crd", name, "-o", jsonpath, check=False).stdout.strip() == "True"

        for name in crds:
            wait_for(lambda: established(name), timeout, what=f"CRD {name} established")  # noqa: B023

    def up(self) -> subprocess.CompletedProcess:
        """Run tests/cluster/up for this cluster (idempotent: restarts a dead agent)."""
        env = {**os.environ, "RLJOB_TESTCLUSTER_CACHE": str(self.cache), "RLJOB_TESTCLUSTER_NAME": self.name}
        res = subprocess.run([str(HERE / "up")], capture_output=True, text=True, env=env, timeout=600)
        if res.returncode != 0:
            raise AssertionError(f"tests/cluster/up failed: {res.stderr[-3000:]}")
        return res

    def agent_pid(self) -> int:
        return int((self.cache / "agent.pid").read_text())

    def api(self):
        from kubernetes import config

        if self.in_netns([]):
            raise RuntimeError(f"the API server listens in network namespace {self.netns}; run the "
                               f"tests there (ip netns exec {self.netns} ...) or use .kubectl")
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    wait_for = staticmethod(wait_for)

    def create_namespace(self, name: str) -> str:
        """Create `name` and wait for its default ServiceAccount: a pod created before it exists
        is refused by the ServiceAccount admission."""
        self.kubectl("create", "namespace", name)
        wait_for(lambda: self.kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode == 0,
                 timeout=60, what=f"default serviceaccount in {name}")  # fmt: skip
        return name

    def wait_pod(self, namespace: str, name: str, pred: Callable[[Any], bool], timeout: float = 60.0,
                 what: str = ""):
        """Poll the pod until pred(pod) is true; returns the pod (kubernetes V1Pod)."""
        from kubernetes import client

        core = client.CoreV1Api(self.api())

        def check():
            pod = core.read_namespaced_pod(name, namespace)
            return pod if pred(pod) else None

        return wait_for(check, timeout=timeout, what=what or f"pod {namespace}/{name}")

    def wait_pod_phase(self, namespace: str, name: str, phase: str, timeout: float = 60.0):
        return self.wait_pod(namespace, name, lambda p: p.status.phase == phase, timeout,
                             what=f"pod {namespace}/{name} phase {phase}")


def inside_netns(name: str) -> bool:
    """Whether this process is in the named network namespace (/run/netns/<name>)."""
    try:
        return os.stat("/proc/self/ns/net").st_ino == os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return False


def env_value(cache: Path, name: str) -> str | None:
    """A variable `up` wrote to <cache>/env."""
    try:
        lines = (cache / "env").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key == name:
            return value
    return None


def cluster_netns(cache: Path) -> str | None:
    """The cluster's network namespace (pod networking), if it has one."""
    return env_value(cache, "RLJOB_TESTCLUSTER_NETNS")


def _cluster_alive(cache: Path, bin_dir: Path | None) -> bool:
    kcfg = cache / "kubeconfig"
    if bin_dir is None or not kcfg.is_file():
        return False
    argv = [str(bin_dir / "kubectl"), "--kubeconfig", str(kcfg), "version", "--request-timeout=5s"]
    netns = cluster_netns(cache)
    if netns is not None and not inside_netns(netns):
        argv = ["ip", "netns", "exec", netns, *argv]
    try:
        res = subprocess.run(argv, capture_output=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def _agent_alive(cache: Path) -> bool:
    try:
        pid = int((cache / "agent.pid").read_text().strip())
        return b"agent.py" in Path(f"/proc/{pid}/cmdline").read_bytes() and (cache / "agent.ready").exists()
    except (OSError, ValueError):
        return False


def _bin_dir() -> Path | None:
    res = subprocess.run([str(HERE / "build"), "--print"], capture_output=True, text=True,
                         env={**os.environ, "RLJOB_TESTCLUSTER_CACHE": str(cache_dir())})
    return Path(res.stdout.strip()) if res.returncode == 0 else None


# Outcome of bringing the cluster up: ("ok", Cluster) | ("skip", reason) | ("error", reason)
_STATE: dict[str, Any] = {}


def running_cluster() -> Cluster | None:
    """This environment's test cluster if it is up (API answers, agent running), else None.
    Outside pytest too: a benchmark (bench/soak.py) uses the cluster `tests/cluster/up` left."""
    cache = cache_dir()
    bin_dir = _bin_dir()
    if bin_dir is not None and _cluster_alive(cache, bin_dir) and _agent_alive(cache):
        return Cluster(cache / "kubeconfig", bin_dir, cache, netns=cluster_netns(cache))
    return None


def _ensure_cluster(config: pytest.Config) -> None:
    if _STATE:
        return
    cache = cache_dir()
    running = running_cluster()
    if running is not None:
        _STATE["result"] = ("ok", running)
        return
    bin_dir = _bin_dir()
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if bin_dir is None:
        if shutil.which("go") is None:
            _STATE["result"] = ("skip", "test cluster binaries are not built and no Go toolchain is on "
                                        "PATH to build them (tests/cluster/build)")
            return
        if tr:
            tr.write_line("test cluster: building binaries (tests/cluster/build; cold build takes "
                          "tens of minutes on 2 cores, log in <cache>/build.log)")
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / "build.log", "ab") as logf:
            res = subprocess.run([str(HERE / "build")], stdout=logf, stderr=subprocess.STDOUT)
        bin_dir = _bin_dir()
        if res.returncode != 0 or bin_dir is None:
            tail = (cache / "build.log").read_text(errors="replace")[-2000:]
            _STATE["result"] = ("skip", f"cannot build the test cluster binaries (exit {res.returncode}):\n{tail}")
            return
    if tr:
        tr.write_line("test cluster: running tests/cluster/up")
    res = subprocess.run([str(HERE / "up")], capture_output=True, text=True)
    if res.returncode != 0:
        _STATE["result"] = ("error", f"tests/cluster/up failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
        return
    _STATE["result"] = ("ok", Cluster(cache / "kubeconfig", bin_dir, cache, netns=cluster_netns(cache)))


def _podnet_cluster() -> tuple[Cluster, bool]:
    """(cluster with pod networking, whether this session started it)."""
    main_cache, name = cache_dir(), os.environ.get("RLJOB_TESTCLUSTER_NAME", "rljob-test")
    bin_dir = _bin_dir()
    netns = cluster_netns(main_cache)
    if netns is not None and bin_dir is not None and _cluster_alive(main_cache, bin_dir) and _agent_alive(main_cache):
        return Cluster(main_cache / "kubeconfig", bin_dir, main_cache, name=name, netns=netns), False
    cache = main_cache / "podnet"
    cache.mkdir(parents=True, exist_ok=True)
    for key_dir in main_cache.iterdir():  # the built binaries, shared: <cache>/<key>/bin
        link = cache / key_dir.name
        if (key_dir / "bin").is_dir() and not link.exists():
            link.symlink_to(key_dir.resolve())
    env = {**os.environ, "RLJOB_TESTCLUSTER_CACHE": str(cache), "RLJOB_TESTCLUSTER_PODNET": "1",
           "RLJOB_TESTCLUSTER_NAME": f"{name}-pn"}
    res = subprocess.run([str(HERE / "up")], capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        raise AssertionError(f"tests/cluster/up (RLJOB_TESTCLUSTER_PODNET=1) failed:\n{res.stderr[-3000:]}")
    netns = cluster_netns(cache)
    assert netns, f"{cache}/env names no network namespace"
    pn_bin = env_value(cache, "RLJOB_TESTCLUSTER_BIN")
    assert pn_bin, f"{cache}/env names no bin dir"
    return Cluster(cache / "kubeconfig", Path(pn_bin), cache, name=f"{name}-pn", netns=netns), True


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if {"cluster", "podnet_cluster"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.get_closest_marker("cluster") for item in session.items) and not session.config.option.collectonly:
        _ensure_cluster(session.config)


@pytest.fixture(scope="session")
def cluster(pytestconfig: pytest.Config) -> Cluster:
    _ensure_cluster(pytestconfig)
    kind, value = _STATE["result"]
    if kind == "ok":
        return value
    if kind == "skip" and not in_ci():
        pytest.skip(value)
    pytest.fail(value, pytrace=False)


@pytest.fixture(scope="session")
def podnet_cluster() -> Iterator[Cluster]:
    pn, started = _podnet_cluster()
    try:
        yield pn
    finally:
        if started and os.environ.get("RLJOB_KEEP_CLUSTER", "0") != "1":
            env = {**os.environ, "RLJOB_TESTCLUSTER_CACHE": str(pn.cache), "RLJOB_TESTCLUSTER_NAME": pn.name}
            subprocess.run([str(HERE / "down")], capture_output=True, env=env, timeout=120)


def _ns_name(nodeid: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", nodeid.rsplit("::", 1)[-1].lower()).strip("-")
    return f"t-{base[:40].strip('-')}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = cluster.create_namespace(_ns_name(request.node.nodeid))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
