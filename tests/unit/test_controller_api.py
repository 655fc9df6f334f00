"""The controller API's HTTP contract with a real InferenceController on the fake ports."""

from __future__ import annotations

from typing import Any

import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from rljob_operator.auth import Authorizer
from rljob_operator.controller_api import ControlServer, ops_app
from rljob_operator.metrics import Metrics
from rljob_operator.registry import JobRegistry

from controller_runtime.api.control import job_path
from controller_runtime.api.spec import InferenceSpec
from controller_runtime.clock import FakeClock
from controller_runtime.controller import InferenceController
from controller_runtime.fakes import FakeEngines, FakePlatform

TOKEN = "Bearer trainer-token"


class Reviewer:
    async def token_review(self, token: str) -> dict[str, Any]:
        if token == "trainer-token":
            return {"authenticated": True, "user": {"username": "system:serviceaccount:ns:trainer"}}
        if token == "other-token":
            return {"authenticated": True, "user": {"username": "system:serviceaccount:ns:other"}}
        return {"authenticated": False, "error": "bad token"}

    async def subject_access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        return {"allowed": spec["user"].endswith(":trainer")}


class Handle:
    """A JobHandle that records status writes instead of patching Kubernetes."""

    def __init__(self, controller: InferenceController) -> None:
        self.namespace, self.name = "ns", "job"
        self.controller = controller
        self.published: list[tuple[str, dict[str, Any]]] = []
        self.engines: FakeEngines | None = None  # the fixture's, for tests that make an engine fail

    async def publish(self, why: str) -> None:
        self.published.append((why, self.controller.status_patch()))

    def poke(self) -> None:
        pass


@pytest_asyncio.fixture(loop_scope="function")
async def setup():
    clock = FakeClock()
    spec = InferenceSpec(replicas=2, gpus_per_engine=0, health_check={"interval_seconds": 1, "failure_threshold": 2})
    engines = FakeEngines()
    ctl = InferenceController("job", spec, FakePlatform(), engines, clock=clock, serve_initial_weights=True)
    await ctl.reconcile()
    await ctl.reconcile()
    await ctl.probe_health()
    registry = JobRegistry()
    handle = Handle(ctl)
    handle.engines = engines
    registry.add(handle)
    leader = {"is": True}
    metrics = Metrics()
    server = ControlServer(registry, Authorizer(Reviewer(), clock=clock), is_leader=lambda: leader["is"],
                           leader_name=lambda: "op-0", metrics=metrics)
    async with TestClient(TestServer(server.app())) as client:
        yield client, handle, leader, metrics


def path(verb: str, name: str = "job") -> str:
    return job_path("ns", name, verb)


async def test_cells_lists_engines_and_serving_endpoints(setup):
    client, _, _, _ = setup
    r = await client.get(path("cells"), headers={"Authorization": TOKEN})
    body = await r.json()
    assert r.status == 200, body
    assert [e["state"] for e in body["engines"]] == ["Serving", "Serving"]
    assert len(body["servingEndpoints"]) == 2


async def test_full_window_is_recorded_in_status_before_each_answer(setup):
    client, handle, _, metrics = setup
    r = await client.post(path("start_update_weights"), json={"holder": "trainer-0"}, headers={"Authorization": TOKEN})
    window = await r.json()
    assert r.status == 200, window
    assert [e["cell"] for e in window["engines"]] == ["job-cell-0", "job-cell-1"]
    assert window["lock"]["holder"] == "trainer-0"
    assert handle.published[-1][0] == "start_update_weights" and handle.published[-1][1]["lock"]["holder"] == "trainer-0"

    again = await client.post(path("start_update_weights"), json={"holder": "x"}, headers={"Authorization": TOKEN})
    assert again.status == 409 and (await again.json())["reason"] == "LockHeld" and "Retry-After" in again.headers

    r = await client.post(path("end_update_weights"), json={"snapshot": window["snapshot"], "weightVersion": "7"},
                          headers={"Authorization": TOKEN})
    assert r.status == 200, await r.text()
    assert handle.published[-1][1]["lock"] is None and handle.published[-1][1]["weightVersion"] == "7"
    assert b"rljob_weight_update_duration_seconds_count" in metrics.exposition()


async def test_abort_stops_snapshot_participants_and_releases_the_lock(setup):
    client, handle, _, _ = setup
    r = await client.post(path("start_update_weights"), json={"holder": "t"}, headers={"Authorization": TOKEN})
    window = await r.json()
    r = await client.post(path("abort_update_weights"), json={"snapshot": window["snapshot"]}, headers={"Authorization": TOKEN})
    body = await r.json()
    assert r.status == 200 and sorted(body["stopped"]) == ["job-cell-0", "job-cell-1"]
    assert handle.published[-1][1]["lock"] is None


async def test_wrong_snapshot_is_409(setup):
    client, _, _, _ = setup
    await client.post(path("start_update_weights"), json={"holder": "t"}, headers={"Authorization": TOKEN})
    r = await client.post(path("end_update_weights"), json={"snapshot": {"job-cell-0": 99}}, headers={"Authorization": TOKEN})
    assert r.status == 409 and (await r.json())["reason"] == "SnapshotMismatch"


async def test_unauthenticated_and_unauthorized_calls_are_refused_with_json(setup):
    client, handle, _, _ = setup
    r = await client.post(path("offload"), json={})
    assert r.status == 401 and (await r.json())["reason"] == "Unauthenticated"
    r = await client.post(path("offload"), json={}, headers={"Authorization": "Bearer other-token"})
    body = await r.json()
    assert r.status == 403 and "rljobs/control" in body["error"]
    assert handle.published == []


async def test_standby_answers_503_with_retry_after(setup):
    client, _, leader, _ = setup
    leader["is"] = False
    r = await client.get(path("cells"), headers={"Authorization": TOKEN})
    assert r.status == 503 and r.headers["Retry-After"] == "2"
    assert "op-0" in (await r.json())["error"]


async def test_unknown_job_bad_body_and_unknown_verb(setup):
    client, _, _, _ = setup
    assert (await client.get(path("cells", name="nope"), headers={"Authorization": TOKEN})).status == 404
    r = await client.post(path("prepare_rollout"), data=b"{not json", headers={"Authorization": TOKEN})
    assert r.status == 400
    r = await client.post(path("prepare_rollout"), json={"rolloutId": -1}, headers={"Authorization": TOKEN})
    assert r.status == 400
    assert (await client.post(path("explode"), json={}, headers={"Authorization": TOKEN})).status == 404


async def test_offload_onload_and_prepare_rollout_write_status(setup):
    client, handle, _, _ = setup
    r = await client.post(path("offload"), json={"tags": ["weights", "kv_cache"]}, headers={"Authorization": TOKEN})
    body = await r.json()
    assert r.status == 200 and {e["state"] for e in body["engines"]} == {"Offloaded"}
    r = await client.post(path("onload"), json={"tags": ["weights", "kv_cache"]}, headers={"Authorization": TOKEN})
    assert {e["state"] for e in (await r.json())["engines"]} == {"Serving"}
    r = await client.post(path("prepare_rollout"), json={"rolloutId": 3}, headers={"Authorization": TOKEN})
    assert (await r.json())["rolloutId"] == 3
    assert [w for w, _ in handle.published] == ["offload", "onload", "prepare_rollout"]


async def test_ops_app_serves_metrics_and_healthz():
    metrics = Metrics()
    metrics.api_calls.labels("cells", "200").inc()
    async with TestClient(TestServer(ops_app(metrics, lambda: (True, "standby")))) as client:
        r = await client.get("/metrics")
        assert r.status == 200 and 'rljob_controller_api_calls_total{code="200",verb="cells"} 1.0' in await r.text()
        r = await client.get("/healthz")
        assert r.status == 200 and (await r.json())["detail"] == "standby"


async def test_job_without_controller_says_why():
    jobs = {
        "susp": {"spec": {"suspend": True}, "status": {"phase": "Suspended"}},
        "done": {"spec": {}, "status": {"phase": "Succeeded"}},
        "new": {"spec": {}, "status": {}},
    }

    async def job_exists(ns: str, name: str):
        return jobs.get(name)

    server = ControlServer(JobRegistry(), Authorizer(Reviewer(), clock=FakeClock()), is_leader=lambda: True,
                           job_exists=job_exists)
    async with TestClient(TestServer(server.app())) as client:
        got = {}
        for name in ("susp", "done", "new", "missing"):
            r = await client.get(path("cells", name=name), headers={"Authorization": TOKEN})
            got[name] = (r.status, (await r.json())["reason"])
    assert got == {"susp": (409, "Suspended"), "done": (409, "Finished"), "new": (503, "ControllerStarting"),
                   "missing": (404, "JobNotFound")}


def test_eval_fleet_from_the_controller_is_answered_as_plain_data() -> None:
    from rljob_operator.controller_api import eval_response

    from controller_runtime.evalpin import EvalFleet

    fleet = EvalFleet(["http://127.0.0.1:1"], "v3", "/ckpt/3", False, "pin_violation", "engine reports v2", {"http://127.0.0.1:1": "v2"})
    resp = eval_response(fleet)
    assert resp.skip_reason == "pin_violation" and resp.versions == {"http://127.0.0.1:1": "v2"}
    assert resp.to_wire()["pinnedVersion"] == "v3"


async def test_offload_answers_which_cells_moved_and_which_refused_after_writing_status(setup):
    client, handle, _, _ = setup
    assert handle.engines is not None
    handle.engines.engines[FakePlatform.endpoint_of("job-cell-1", 0)].fail.add("release_memory")
    r = await client.post(path("offload"), json={"tags": ["kv_cache"]}, headers={"Authorization": TOKEN})
    body = await r.json()
    assert r.status == 200, body
    assert body["changed"] == {"job-cell-0": ["kv_cache"]}
    assert list(body["failed"]) == ["job-cell-1"] and "release_memory refused" in body["failed"]["job-cell-1"]
    assert [w for w, _ in handle.published] == ["offload"]


async def test_verbs_take_the_methods_of_the_table(setup):
    client, _, _, _ = setup
    r = await client.get(path("offload"), headers={"Authorization": TOKEN})
    assert r.status == 405 and (await r.json())["reason"] == "MethodNotAllowed"
    for method in ("GET", "POST"):  # eval_fleet is a read the executor may POST
        r = await client.request(method, path("eval_fleet"), headers={"Authorization": TOKEN})
        assert r.status == 200 and (await r.json())["skipReason"] == "not_configured"
