"""A pod of a cell the API server refuses is made again once it may be, with no restart charged
(the real API server's ResourceQuota admission refuses it).

A 2-pod cell in a namespace whose quota admits one pod: one create succeeds, the other is
refused (403, exceeded quota), as a brand-new namespace's missing ServiceAccount refused one in
a scale benchmark. The operator used to take the missing pod for a failed one: the cell went
Unhealthy and was replaced, a restart of its budget spent on a pod that never existed. Now the
cell stays Pending, each pass reports the refusal (a ReconcileError Event), and when the quota is raised the missing pod
is made and the cell serves at generation 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.operator_harness import (
    Kube,
    OperatorProcess,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


@pytest.fixture
def kube(cluster, namespace) -> Kube:
    install_crd(cluster)
    return Kube(cluster, namespace)


def quota(pods: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"}, "spec": {"hard": {"pods": str(pods)}}}


def test_a_refused_pod_of_a_pending_cell_is_made_once_the_quota_allows_it_and_no_restart_is_spent(kube, tmp_path):
    kube.apply(quota(1))
    wait_for(lambda: ((kube.get("resourcequota", "pods") or {}).get("status") or {}).get("hard"), 60,
             what="the quota's usage computed (admission needs it)")  # fmt: skip
    job = make_rljob("refused", replicas=1)
    inf = job["spec"]["inference"]
    inf.update(engine="sglang", gpusPerEngine=2, gpusPerNode=1)  # a cell of two 1-GPU pods
    inf.pop("tensorParallelSize", None)
    del job["spec"]["rollout"]  # no executor pod to take the quota's one pod
    kube.apply(job)
    op = OperatorProcess(kube.cluster, kube.ns, tmp_path)
    try:
        refused = wait_for(lambda: [e for e in kube.events("refused") if "exceeded quota" in e.get("message", "")], 60,
                           what="a ReconcileError naming the quota")  # fmt: skip
        assert len(kube.engine_pods("refused")) == 1, refused
        kube.apply(quota(10))
        wait_for(lambda: kube.status("refused").get("ready") == "1/1", 120, what="1/1 once the quota allows both pods")
        cell = kube.status("refused")["engines"][0]
        assert (cell["generation"], cell["restarts"]) == (0, 0), cell
        assert sorted(p["metadata"]["name"] for p in kube.engine_pods("refused")) == [
            "refused-cell-0-g0-0", "refused-cell-0-g0-1"]  # fmt: skip
        assert not [e for e in kube.events("refused") if e["reason"] in ("CellUnhealthy", "CellReplaced")]
    finally:
        op.stop()
        release_rljobs(kube.cluster, kube.ns)
