"""The test cluster for the benchmarks that need one (heal_bench, control_bench).

Outside pytest there is no `cluster` fixture: this brings up (or reuses) the cluster that the
RLJOB_TESTCLUSTER_* variables name, exactly as `tests/cluster/up` does for the tests, and
gives each run a namespace of its own, deleted afterwards.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.cluster.fixtures import Cluster, cache_dir, cluster_netns, env_value

ROOT = Path(__file__).resolve().parent.parent


def open_cluster() -> Cluster:
    """The test cluster, brought up when it is not running (`up` is idempotent)."""
    res = subprocess.run([str(ROOT / "tests" / "cluster" / "up")], capture_output=True, text=True,
                         env=dict(os.environ), timeout=900)  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(f"tests/cluster/up failed:\n{res.stderr[-3000:]}")
    cache = cache_dir()
    bin_dir = env_value(cache, "RLJOB_TESTCLUSTER_BIN")
    if bin_dir is None:
        raise SystemExit(f"{cache}/env names no RLJOB_TESTCLUSTER_BIN")
    return Cluster(cache / "kubeconfig", Path(bin_dir), cache, netns=cluster_netns(cache))


@contextlib.contextmanager
def bench_namespace(cluster: Cluster, prefix: str) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount, deleted when the run ends."""
    ns = cluster.create_namespace(f"{prefix}-{uuid.uuid4().hex[:6]}")
    try:
        yield ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
