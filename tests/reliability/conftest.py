"""Fixtures of the reliability suite: the history checks after every test on the test cluster,
and what it shares with the other tiers (one definition each)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator

import pytest

from tests.cluster.fixtures import in_ci
from tests.integration.test_helm_chart import helm  # noqa: F401  (the real helm binary, as a fixture)
from tests.reliability import history

audit_log = history.audit_log  # one definition: bench/soak.py reads the same log


@pytest.fixture(autouse=True)
def history_holds(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used a namespace of the test cluster, the invariants of
    tests/reliability/history.py hold for everything the API server saw in it."""
    if "namespace" not in request.fixturenames:
        yield
        return
    cluster = request.getfixturevalue("cluster")
    namespace = request.getfixturevalue("namespace")
    yield
    path = audit_log(cluster)
    if not path.exists():
        message = (
            f"no audit log at {path}: the cluster predates tests/cluster/audit-policy.yaml (down and up)"
        )
        assert not in_ci(), message
        warnings.warn(message, stacklevel=1)
        return
    r = cluster.kubectl("get", "rljobs", "-n", namespace, "-o", "json", check=False)
    statuses = {
        j["metadata"]["name"]: j.get("status") or {} for j in json.loads(r.stdout or "{}").get("items", [])
    }
    broken = list(history.violations(history.read(path, namespace), statuses))
    assert not broken, "history invariants broken (audit log):\n" + "\n".join(broken)
