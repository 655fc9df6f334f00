"""Kept API objects share their keys and short strings (`rljob_operator.interned`)."""

from __future__ import annotations

import copy
import json
from typing import Any

from rljob_operator.interned import SHARED_MAX_LEN, interned
from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.job_runtime import JobRuntime
from rljob_operator.registry import JobRegistry

from controller_runtime.clock import FakeClock
from controller_runtime.fakes import FakeEngines, FakePlatform
from tests.unit.test_job_runtime import FakeKube, rljob, settle


def decoded(obj: Any) -> Any:
    """`obj` as a client decodes it: every string a new object (one `json.loads` call shares
    equal keys within itself, never with another call's)."""
    return json.loads(json.dumps(obj))


def test_an_interned_copy_is_equal_and_shares_keys_and_short_strings_with_other_copies():
    long = "x" * (SHARED_MAX_LEN + 1)
    body = {"status": {"engines": [{"state": "Serving", "message": long, "restarts": 0, "ok": True}], "phase": None}}
    a, b = interned(decoded(body)), interned(decoded(body))
    assert a == body and b == body
    ea, eb = a["status"]["engines"][0], b["status"]["engines"][0]
    assert all(ka is kb for ka, kb in zip(ea, eb, strict=True))
    assert ea["state"] is eb["state"]
    assert ea["message"] is not eb["message"]  # long strings are left as decoded
    plain_a, plain_b = decoded(body), decoded(body)
    assert next(iter(plain_a["status"])) is not next(iter(plain_b["status"]))  # what it is for


async def test_the_status_each_job_keeps_shares_its_keys_with_the_other_jobs():
    """The status writer keeps the status the API server answered for every job, until its
    next write: decoded afresh each time, so without interning each job held its own copies."""

    class DecodingKube(FakeKube):
        async def patch_rljob_status(self, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
            return decoded(await super().patch_rljob_status(ns, name, status))

    kept = []
    for name in ("a", "b"):
        body = rljob()
        body["metadata"]["name"] = name
        platform = FakePlatform()
        kube = DecodingKube(copy.deepcopy(body))
        kube.platform = platform
        rt = JobRuntime(body=body, kube=kube, platform=platform, registry=JobRegistry(), metrics=Metrics(),
                        controller_url="http://op:8080", resync_seconds=5, clock=FakeClock(), engines=FakeEngines())
        await settle(rt)
        kept.append(rt.status.stored)
    a, b = kept
    assert a["phase"] == b["phase"] == "Running"
    ca, cb = a["conditions"][0], b["conditions"][0]
    assert all(ka is kb for ka, kb in zip(ca, cb, strict=True))
    assert ca["type"] is cb["type"]


def test_the_pod_cache_shares_every_label_value_between_pods_whatever_its_length():
    """Label values are up to 63 characters and repeat across a job's pods (job, cell, role)."""
    from rljob_operator.pod_cache import slim_pod

    job = "j" * (SHARED_MAX_LEN + 10)
    pod = {"metadata": {"name": "p", "labels": {"rljob.io/job": job, "rljob.io/role": "engine"}}, "status": {}}
    a, b = slim_pod(decoded(pod)), slim_pod(decoded(pod))
    assert a["metadata"]["labels"] == pod["metadata"]["labels"]
    assert a["metadata"]["labels"]["rljob.io/job"] is b["metadata"]["labels"]["rljob.io/job"]
