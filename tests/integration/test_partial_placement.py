"""Without Kueue, a multi-pod cell never holds GPUs partially forever (the real kube-scheduler).

A 16-GPU engine on 8-GPU nodes is a cell of 2 pods. Pinned to one GPU node, only one of them
fits: it holds its 8 GPUs while the other stays unschedulable. After
`healthCheck.schedulingDeadlineSeconds` the operator deletes the cell and recreates it after
the restart backoff, and an Event says why.
"""

from __future__ import annotations

import pytest

from tests.integration.operator_harness import (
    PROCESS_LABEL,
    Kube,
    OperatorProcess,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture
def kube(cluster, namespace) -> Kube:
    install_crd(cluster)
    return Kube(cluster, namespace)


def test_a_half_scheduled_cell_is_deleted_and_retried_after_the_scheduling_deadline(kube, tmp_path):
    job = make_rljob("half", replicas=1, backoff=1)
    inf = job["spec"]["inference"]
    inf.update(gpusPerEngine=16, gpusPerNode=8)
    inf["placement"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-0"}  # room for one 8-GPU pod only
    inf["podMetadata"]["labels"].pop(PROCESS_LABEL)  # kwok runs the pod that fits; no engine needed
    inf["healthCheck"]["schedulingDeadlineSeconds"] = 10  # long enough for kubectl polls to see each generation
    kube.apply(job)
    op = OperatorProcess(kube.cluster, kube.ns, tmp_path)
    try:

        def placed(generation: int) -> list[bool]:
            pods = kube.pods(f"rljob.io/job=half,rljob.io/generation={generation}")
            return sorted(bool(p["spec"].get("nodeName")) for p in pods if not p["metadata"].get("deletionTimestamp"))

        wait_for(lambda: placed(0) == [False, True], 60, what="generation 0: one pod scheduled, one not")
        events = wait_for(lambda: [e for e in kube.events("half") if e["reason"] == "SchedulingDeadlineExceeded"], 60,
                          what="SchedulingDeadlineExceeded event")
        assert "only 1/2 pods scheduled within 10 s" in events[0]["message"]
        wait_for(lambda: placed(1) == [False, True], 60, what="recreated as generation 1 after the backoff")
        assert placed(0) == [], "the half-placed generation 0 released its GPUs"
        assert any(e["reason"] == "CellReplaced" for e in kube.events("half"))
    finally:
        op.stop()
        release_rljobs(kube.cluster, kube.ns)
