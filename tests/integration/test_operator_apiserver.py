"""The operator's own Kubernetes adapters against the real kube-apiserver (no nodes needed):
Lease-based leader election, TokenReview + SubjectAccessReview, status patches and Events,
and two operator processes of which only the leader serves the controller API."""

from __future__ import annotations

import asyncio

import pytest
from rljob_operator.auth import Authorizer
from rljob_operator.kube.kubeapi import KubeApi, load_api_client
from rljob_operator.leader import LeaderElector
from rljob_operator.lease_store import KubeLeaseStore

from tests.integration.operator_harness import (
    Kube,
    OperatorProcess,
    call,
    control_rbac,
    install_crd,
    make_rljob,
    release_rljobs,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture
def kubeapi(cluster):
    api = KubeApi(load_api_client(str(cluster.kubeconfig)))
    yield api
    api.close()


def elector(kubeapi: KubeApi, namespace: str, identity: str) -> LeaderElector:
    return LeaderElector(KubeLeaseStore(kubeapi, namespace, "test-leader"), identity, 3, 2, 0.5)


async def test_lease_election_on_a_real_lease(kubeapi, namespace, cluster):
    a, b = elector(kubeapi, namespace, "a"), elector(kubeapi, namespace, "b")
    await a.tick()
    await b.tick()
    assert a.is_leader() and not b.is_leader() and b.leader == "a"
    lease = Kube(cluster, namespace).get("lease", "test-leader")
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 3

    # a stops renewing: b must not take over before a's lease has expired by b's own clock,
    # and a must consider itself deposed (renew deadline 2 s) before b leads.
    a_down_at = b_up_at = None
    loop = asyncio.get_running_loop()
    start = loop.time()
    while b_up_at is None and loop.time() - start < 15:
        await b.tick()
        if a_down_at is None and not a.is_leader():
            a_down_at = loop.time()
        if b.is_leader():
            b_up_at = loop.time()
        assert not (a.is_leader() and b.is_leader())
        await asyncio.sleep(0.25)
    assert a_down_at is not None and b_up_at is not None and a_down_at <= b_up_at
    lease = Kube(cluster, namespace).get("lease", "test-leader")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1

    # a comes back: its stale view conflicts or sees b alive; it stays a follower.
    await a.tick()
    assert not a.is_leader()
    await b.release()
    await a.tick()
    assert a.is_leader()


async def test_token_and_access_reviews_decide_the_caller(kubeapi, namespace, cluster):
    kube = Kube(cluster, namespace)
    trainer, nobody = control_rbac(kube, "job")
    auth = Authorizer(kubeapi, cache_seconds=0)
    allowed = await auth.authorize(f"Bearer {trainer}", namespace, "job")
    assert allowed.allowed and allowed.caller.user == f"system:serviceaccount:{namespace}:trainer"
    other_job = await auth.authorize(f"Bearer {trainer}", namespace, "another-job")
    assert other_job.http_status == 403  # the Role names the job
    forbidden = await auth.authorize(f"Bearer {nobody}", namespace, "job")
    assert forbidden.http_status == 403 and "nobody" in forbidden.message
    bogus = await auth.authorize("Bearer eyJhbGciOiJSUzI1NiJ9.e30.AAAA", namespace, "job")
    assert bogus.http_status == 401


async def test_status_patch_and_events_on_a_real_rljob(kubeapi, namespace, cluster):
    install_crd(cluster)
    kube = Kube(cluster, namespace)
    kube.apply(make_rljob("st", replicas=1))
    obj = await kubeapi.patch_rljob_status(namespace, "st", {"phase": "Pending", "ready": "0/1", "lock": None})
    assert obj["status"]["ready"] == "0/1"
    obj = await kubeapi.patch_rljob_status(namespace, "st", {"lock": {"holder": "t", "since": "2026-01-01T00:00:00Z",
                                                                      "expires": "2026-01-01T00:10:00Z"}})
    assert obj["status"]["lock"]["holder"] == "t"
    obj = await kubeapi.patch_rljob_status(namespace, "st", {"lock": None})
    assert "lock" not in obj["status"] and obj["status"]["ready"] == "0/1"
    involved = {"apiVersion": "rljob.io/v1alpha1", "kind": "RLJob", "name": "st", "namespace": namespace,
                "uid": obj["metadata"]["uid"]}
    await kubeapi.create_event(involved, "Warning", "CellUnhealthy", "[st-cell-0] 2 consecutive failed probes", 1.8e9)
    events = kube.events("st")
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "CellUnhealthy")]
    described = cluster.kubectl("describe", "rlj", "st", "-n", namespace).stdout
    assert "CellUnhealthy" in described


def test_standby_operator_answers_503_until_it_leads(cluster, namespace, tmp_path):
    install_crd(cluster)
    kube = Kube(cluster, namespace)
    trainer, _ = control_rbac(kube, "nojob")
    a = OperatorProcess(cluster, namespace, tmp_path, identity="op-a")
    try:
        wait_for(a.is_leader, 30, what="op-a leads")
        b = OperatorProcess(cluster, namespace, tmp_path, identity="op-b")
        try:
            assert not b.is_leader() and b.healthz()["detail"] == "standby"
            code, body, headers = call(b.api, namespace, "nojob", "cells", token=trainer)
            assert code == 503 and body["reason"] == "NotLeader" and "op-a" in body["error"]
            assert headers.get("Retry-After") == "2"
            code, body, _ = call(a.api, namespace, "nojob", "cells", token=trainer)
            assert code == 404 and body["reason"] == "JobNotFound"  # the leader answers for real
            assert a.stop() == 0  # SIGTERM: kopf stops, the lease is released
            wait_for(b.is_leader, 15, what="op-b takes over at once after the release")
            assert call(b.api, namespace, "nojob", "cells", token=trainer)[0] == 404
            assert "rljob_operator_leader 1.0" in b.metrics()
        finally:
            b.stop()
    finally:
        a.stop()
        release_rljobs(cluster, namespace)
