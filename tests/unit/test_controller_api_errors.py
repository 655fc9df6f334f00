"""The error table both ways: every row, through both servers and both clients.

Each case makes the controller (a stub, or a real InferenceController on the fake ports)
fail, lets a real server answer (the operator's ControlServer or local mode's
LocalControlAPI, over loopback HTTP), and checks the real client raises that row's own
class with that row's status and reason; the in-process client must raise the same.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from pydantic import ValidationError
from rljob_cli import local_api
from rljob_cli.local_api import LocalControlAPI
from rljob_client.controller_client import (
    ControllerClient,
    InferenceControllerClient,
    LocalControllerClient,
    MemoryChangeFailed,
)
from rljob_operator import controller_api
from rljob_operator.auth import Authorizer
from rljob_operator.controller_api import ControlServer
from rljob_operator.kube.kubeapi import KubeApiError
from rljob_operator.registry import JobRegistry

from controller_runtime.api import wire_errors
from controller_runtime.api.control import PrepareRolloutRequest
from controller_runtime.api.spec import InferenceSpec, MemoryTag
from controller_runtime.api.wire_errors import (
    BY_REASON,
    ERRORS,
    ControllerAPIError,
    ControllerJobFinished,
    ControllerJobSuspended,
    ErrorRow,
    answer_for,
    error_from_answer,
    refusal,
)
from controller_runtime.clock import FakeClock
from controller_runtime.controller import InferenceController
from controller_runtime.errors import (
    ControllerError,
    EffectNotRecorded,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    LockHeld,
    PlatformError,
    WeightCheckMismatch,
)
from controller_runtime.events import Reason
from controller_runtime.fakes import FakeEngines, FakePlatform

TOKEN = "trainer-token"
KINDS = ("operator", "local", "in-process")


class Reviewer:
    async def token_review(self, token: str) -> dict[str, Any]:
        if token == TOKEN:
            return {"authenticated": True, "user": {"username": "system:serviceaccount:ns:trainer"}}
        if token == "other-token":
            return {"authenticated": True, "user": {"username": "system:serviceaccount:ns:other"}}
        if token == "review-down":
            raise ConnectionError("apiserver unreachable")
        return {"authenticated": False, "error": "bad token"}

    async def subject_access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        return {"allowed": spec["user"].endswith(":trainer")}


class Handle:
    """A job handle whose status write fails `failing[why]` times for that verb, with an API-server error."""

    def __init__(self, controller: Any, failing: dict[str, int] | None = None) -> None:
        self.namespace, self.name = "ns", "job"
        self.controller = controller
        self.published: list[str] = []
        self.failing = dict(failing or {})

    async def publish(self, why: str) -> None:
        self.published.append(why)
        if self.failing.get(why, 0) > 0:
            self.failing[why] -= 1
            raise KubeApiError(f"PATCH /apis/rljobs/{self.name}/status", 503, "Service Unavailable")

    def poke(self) -> None:
        pass


class Failing:
    """A controller whose prepare_rollout raises what the test puts in `exc`."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def prepare_rollout(self, rollout_id: int) -> None:
        raise self.exc

    def status_patch(self) -> dict[str, Any]:
        return {}

    def engine_statuses(self) -> list[Any]:
        return []

    def serving_endpoints(self) -> list[str]:
        return []


@contextlib.asynccontextmanager
async def client_of(kind: str, controller: Any, tmp_path: Path) -> AsyncIterator[ControllerClient]:
    """A real client talking to `controller` through a real server of `kind` (or in-process)."""
    if kind == "in-process":
        yield LocalControllerClient(controller, holder="trainer-0")
        return
    if kind == "operator":
        registry = JobRegistry()
        registry.add(Handle(controller))
        server = ControlServer(registry, Authorizer(Reviewer(), clock=FakeClock()), is_leader=lambda: True)
        async with TestServer(server.app()) as ts:
            client = InferenceControllerClient(str(ts.make_url("")), "job", "ns", token=TOKEN, retry_timeout=0.0)
            try:
                yield client
            finally:
                await client.close()
        return
    api = LocalControlAPI(controller, "job", "ns", tmp_path / "token")
    url = await api.start()
    client = InferenceControllerClient(url, "job", "ns", token=api.token, retry_timeout=0.0)
    try:
        yield client
    finally:
        await client.close()
        await api.close()


def raised_by_sample(row: ErrorRow) -> BaseException:
    """An exception of the controller's own (not an API class) that the row answers."""
    cls = row.raised_by[0]
    if cls is ValidationError:
        try:
            PrepareRolloutRequest.model_validate({"rolloutId": -1})
        except ValidationError as exc:
            return exc
    if issubclass(cls, EngineError):
        return cls("http://engine-0:8000", "down")
    if cls is WeightCheckMismatch:
        return WeightCheckMismatch({"job-cell-0": ["w"]})
    if cls is Exception:
        return RuntimeError("a bug")
    if cls is EffectNotRecorded:
        return EffectNotRecorded("prepare_rollout", ConnectionError("the API server is down"))
    return cls("refused")


SAMPLES = [pytest.param(row, "api", id=f"{row.reason}-api") for row in ERRORS] + [
    pytest.param(row, "raised", id=f"{row.reason}-raised") for row in ERRORS if row.raised_by
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("row", "source"), SAMPLES)
async def test_every_error_row_reaches_the_client_as_its_own_class(row: ErrorRow, source: str, kind: str,
                                                                   tmp_path: Path) -> None:
    exc = refusal(row.client, "refused") if source == "api" else raised_by_sample(row)
    async with client_of(kind, Failing(exc), tmp_path) as client:
        with pytest.raises(ControllerAPIError) as err:
            await client.prepare_rollout(1)
    assert type(err.value) is row.client
    assert (err.value.status, err.value.reason) == (row.status, row.reason)
    for base in row.raised_by:  # `except LockHeld` / `except EngineError` keeps working over HTTP
        if issubclass(base, ControllerError):
            assert isinstance(err.value, base)


def test_the_table_has_one_row_and_one_class_per_reason() -> None:
    assert len(BY_REASON) == len(ERRORS)
    assert len({row.client for row in ERRORS}) == len(ERRORS)
    # Every API exception class a server could raise has its row (only the families have none).
    families = {ControllerAPIError, wire_errors.ControllerUnauthorized, wire_errors.ControllerNotFound,
                wire_errors.ControllerUnavailable}
    classes = {c for _, c in inspect.getmembers(wire_errors, inspect.isclass)
               if issubclass(c, ControllerAPIError)}
    assert classes - families == {row.client for row in ERRORS}


def test_answers_only_carry_reasons_of_the_table() -> None:
    stray = ControllerAPIError(418, "Teapot", "made up on a server")
    assert answer_for(stray).body.reason == "InternalError"
    for sample in (stray, KeyError("x"), LockHeld("x"), EngineTimeout("e", "slow"), TimeoutError()):
        assert answer_for(sample).body.reason in BY_REASON


@pytest.mark.parametrize("module", [controller_api, local_api])
def test_servers_build_error_bodies_only_through_the_table(module: Any) -> None:
    """A server that wrote its own ErrorResponse could send a reason no client maps."""
    source = inspect.getsource(module)
    assert "ErrorResponse(" not in source and "status=4" not in source and "status=5" not in source


async def test_every_authorizer_refusal_is_a_row_with_the_same_reason() -> None:
    authorizer = Authorizer(Reviewer(), clock=FakeClock())
    seen = set()
    for header in (None, "Bearer bad", "Bearer other-token", "Bearer review-down"):
        decision = await authorizer.authorize(header, "ns", "job")
        assert not decision.allowed
        answer = answer_for(controller_api.denied(decision))
        assert (answer.status, answer.body.reason) == (decision.http_status, decision.reason)
        seen.add(decision.reason)
    assert seen == {"Unauthenticated", "Forbidden", "ReviewUnavailable"}


# -- the three bugs the table fixes ------------------------------------------------------------


@pytest.mark.parametrize(("reason", "phase", "suspend"), [("Finished", "Succeeded", False),
                                                          ("Suspended", "Suspended", True)])
async def test_a_finished_or_suspended_job_is_not_a_held_lock(reason: str, phase: str, suspend: bool) -> None:
    """A trainer that read these as LockHeld retried forever against a job that will never answer."""
    jobs = {"job": {"spec": {"suspend": suspend}, "status": {"phase": phase}}}

    async def job_exists(ns: str, name: str) -> dict[str, Any] | None:
        return jobs.get(name)

    server = ControlServer(JobRegistry(), Authorizer(Reviewer(), clock=FakeClock()), is_leader=lambda: True,
                           job_exists=job_exists)
    async with TestServer(server.app()) as ts:
        client = InferenceControllerClient(str(ts.make_url("")), "job", "ns", token=TOKEN, retry_timeout=0.0)
        try:
            with pytest.raises(ControllerAPIError) as err:
                await client.start_update_weights("trainer-0")
        finally:
            await client.close()
    assert err.value.status == 409 and err.value.reason == reason
    assert not isinstance(err.value, LockHeld)
    assert type(err.value) is (ControllerJobFinished if reason == "Finished" else ControllerJobSuspended)


def test_a_409_with_an_unknown_reason_is_not_a_held_lock() -> None:
    err = error_from_answer(409, '{"error": "x", "reason": "SomethingNew"}')
    assert not isinstance(err, LockHeld) and err.reason == "SomethingNew"


@pytest.mark.parametrize(("exc", "status", "reason"), [
    (EngineUnavailable("http://engine-0:8000", "connection refused"), 502, "EngineError"),
    (EngineTimeout("http://engine-0:8000", "no answer"), 504, "EngineTimeout"),
])
async def test_an_engine_error_is_answered_the_same_on_both_servers(exc: EngineError, status: int, reason: str,
                                                                    tmp_path: Path) -> None:
    got = {}
    for kind in KINDS:
        async with client_of(kind, Failing(exc), tmp_path) as client:
            with pytest.raises(ControllerAPIError) as err:
                await client.prepare_rollout(1)
        got[kind] = (err.value.status, err.value.reason, isinstance(err.value, EngineError))
    assert got == {kind: (status, reason, True) for kind in KINDS}


async def fleet_with_one_refusing_engine() -> tuple[InferenceController, FakeEngines]:
    engines = FakeEngines()
    ctl = InferenceController("job", InferenceSpec(replicas=2, gpus_per_engine=0), FakePlatform(), engines,
                              clock=FakeClock(), serve_initial_weights=True)
    await ctl.reconcile()
    await ctl.reconcile()
    await ctl.probe_health()
    engines.engines[FakePlatform.endpoint_of("job-cell-1", 0)].fail.add("release_memory")
    return ctl, engines


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_offload_reaches_the_client_with_which_cells_failed(kind: str, tmp_path: Path) -> None:
    ctl, _ = await fleet_with_one_refusing_engine()
    async with client_of(kind, ctl, tmp_path) as client:
        with pytest.raises(MemoryChangeFailed) as err:
            await client.offload([MemoryTag.kv_cache])
        change = err.value.change
        assert set(change.failed) == {"job-cell-1"} and "release_memory refused" in change.failed["job-cell-1"]
        assert change.changed == {"job-cell-0": [MemoryTag.kv_cache]}
        assert [e.memory for e in change.engines] == [["kv_cache"], []]
        back = await client.onload([MemoryTag.kv_cache])  # what did move comes back, and says so
        assert back.changed == {"job-cell-0": [MemoryTag.kv_cache]} and back.failed == {}
    await ctl.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_clean_offload_answers_what_moved(kind: str, tmp_path: Path) -> None:
    ctl, engines = await fleet_with_one_refusing_engine()
    engines.engines[FakePlatform.endpoint_of("job-cell-1", 0)].fail.clear()
    async with client_of(kind, ctl, tmp_path) as client:
        change = await client.offload([MemoryTag.kv_cache, MemoryTag.weights])
    assert change.failed == {}
    assert change.changed == {c: [MemoryTag.weights, MemoryTag.kv_cache] for c in ("job-cell-0", "job-cell-1")}
    assert {str(e.state) for e in change.engines} == {"Offloaded"}
    await ctl.close()


class SkippingClock:
    """The client's retry clock: a sleep jumps time forward at once and is recorded."""

    def __init__(self) -> None:
        self.t = 0.0
        self.delays: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.t += seconds


@contextlib.asynccontextmanager
async def operator_client(handle: Handle, clock: SkippingClock,
                          retry_timeout: float = 30.0) -> AsyncIterator[InferenceControllerClient]:
    registry = JobRegistry()
    registry.add(handle)
    server = ControlServer(registry, Authorizer(Reviewer(), clock=FakeClock()), is_leader=lambda: True)
    async with TestServer(server.app()) as ts:
        client = InferenceControllerClient(str(ts.make_url("")), "job", "ns", token=TOKEN, holder="trainer-0",
                                           retry_timeout=retry_timeout, clock=clock)
        try:
            yield client
        finally:
            await client.close()


async def serving_fleet() -> tuple[InferenceController, list[Any]]:
    events: list[Any] = []
    ctl = InferenceController("job", InferenceSpec(replicas=2, gpus_per_engine=0), FakePlatform(), FakeEngines(),
                              clock=FakeClock(), serve_initial_weights=True, on_event=events.append)
    await ctl.reconcile()
    await ctl.reconcile()
    await ctl.probe_health()
    return ctl, events


async def test_an_api_server_error_is_never_answered_as_a_refusal() -> None:
    """A KubeApiError was a ControllerError, answered 409: the trainer took an outage for a final no."""
    exc = KubeApiError("PATCH /api/v1/namespaces/ns/pods/p", 503, "Service Unavailable")
    assert isinstance(exc, PlatformError) and not isinstance(exc, ControllerError)
    answer = answer_for(exc)
    assert (answer.status, answer.body.reason) == (502, "PlatformError")
    assert "HTTP 503" in answer.body.error


async def test_a_status_write_that_fails_after_end_is_retried_and_the_window_ends_once() -> None:
    ctl, events = await serving_fleet()
    handle, clock = Handle(ctl, failing={"end_update_weights": 2}), SkippingClock()
    async with operator_client(handle, clock) as client:
        async with client.update_weights(weight_version="7"):
            pass
        cells = await client.cells()
    assert handle.published == ["start_update_weights"] + ["end_update_weights"] * 3
    assert len(clock.delays) == 2, "each NotRecorded answer is retried after its Retry-After"
    ended = [e for e in events if e.reason == Reason.WeightsUpdated]
    assert len(ended) == 1, "the repeated end is answered, not applied again"
    assert not [e for e in events if e.reason == Reason.WindowAborted]
    assert cells.weight_version == "7" and cells.lock is None
    assert {str(e.state) for e in cells.engines} == {"Serving"}
    await ctl.close()


async def test_a_status_write_that_keeps_failing_raises_not_recorded_with_its_cause() -> None:
    ctl, _ = await serving_fleet()
    handle, clock = Handle(ctl, failing={"end_update_weights": 1000}), SkippingClock()
    async with operator_client(handle, clock, retry_timeout=5.0) as client:
        window = await client.start_update_weights("trainer-0")
        with pytest.raises(wire_errors.ControllerNotRecorded) as err:
            await client.end_update_weights(window.snapshot, "7")
    assert (err.value.status, err.value.reason) == (503, "NotRecorded")
    assert "KubeApiError" in err.value.message and "HTTP 503" in err.value.message
    assert clock.t <= 5.0 and len(clock.delays) >= 2, "retried until its deadline, never past it"
    await ctl.close()
