"""The trainer's controller client against a real InferenceController, over HTTP and in-process.

The HTTP server here is a small aiohttp app written for this test (the operator's real
server has its own tests): it dispatches through the same verb and error tables as both
real servers (controller_runtime.api.verbs / wire_errors) onto a real InferenceController
whose platform and engines are the controller_runtime fakes, and adds what a test needs
(a bearer token, a standby phase). What is checked is the client's side of the contract
(paths, bodies, bearer token, retries, typed errors, the window's end/abort discipline)
against real controller behaviour.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from rljob_client.controller_client import (
    ControllerClient,
    ControllerLockHeld,
    ControllerNotFound,
    ControllerSnapshotMismatch,
    ControllerUnauthorized,
    ControllerUnavailable,
    InferenceControllerClient,
    LocalControllerClient,
)

from controller_runtime.api.control import API_PREFIX
from controller_runtime.api.spec import InferenceSpec, MemoryTag
from controller_runtime.api.status import CellState
from controller_runtime.api.verbs import decode_body, dispatch, verb_for
from controller_runtime.api.wire_errors import (
    ControllerJobNotFound,
    ControllerNotLeader,
    ControllerUnauthenticated,
    answer_for,
    refusal,
)
from controller_runtime.clock import FakeClock
from controller_runtime.controller import InferenceController
from controller_runtime.errors import LockHeld
from controller_runtime.fakes import FakeEngines, FakePlatform, settle
from tests.unit.test_token_file import rotate

# Fixtures run in the session loop (pyproject); the tests must share it with their servers.
pytestmark = pytest.mark.asyncio(loop_scope="session")

TOKEN = "test-token"
JOB, NS = "toy", "team-a"


@dataclass
class ControlApp:
    """Routes -> the verb table -> controller; counts requests; can pretend to be a standby replica."""

    controller: InferenceController
    standby_answers: int = 0  # answer this many requests with 503 + Retry-After first
    seen_auth: list[str | None] = field(default_factory=list)
    seen_verbs: list[str] = field(default_factory=list)
    tokens: set[str] = field(default_factory=lambda: {TOKEN})  # the tokens the "TokenReview" accepts
    on_refused: Callable[[], None] | None = None  # runs before a 401 answers (a rotation in flight)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", API_PREFIX + "/namespaces/{ns}/rljobs/{name}/{verb}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        try:
            return await self.serve(request)
        except Exception as exc:
            answer = answer_for(exc)
            return web.json_response(answer.body.to_wire(), status=answer.status, headers=answer.headers or None)

    async def serve(self, request: web.Request) -> web.Response:
        self.seen_auth.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") not in {f"Bearer {t}" for t in self.tokens}:
            if self.on_refused is not None:
                self.on_refused()
            raise refusal(ControllerUnauthenticated, "bad token")
        if self.standby_answers > 0:
            self.standby_answers -= 1
            raise refusal(ControllerNotLeader, "standby replica", retry_after=1)
        ns, name = request.match_info["ns"], request.match_info["name"]
        if (ns, name) != (NS, JOB):
            raise refusal(ControllerJobNotFound, f"rljob {ns}/{name} not found")
        verb = verb_for(request.match_info["verb"], request.method)
        self.seen_verbs.append(verb.name)
        body = decode_body(await request.text()) if request.method != "GET" else {}
        return web.json_response((await dispatch(verb, self.controller, body)).to_wire())


@pytest.fixture
async def controller() -> AsyncIterator[InferenceController]:
    spec = InferenceSpec(replicas=2, gpus_per_engine=0)
    c = InferenceController(JOB, spec, FakePlatform(), FakeEngines(), clock=FakeClock())
    await settle(c)
    assert [s.state for s in c.engine_statuses()] == [CellState.PendingWeights] * 2
    yield c
    await c.close()


@contextlib.asynccontextmanager
async def serving(controller: InferenceController) -> AsyncIterator[tuple[ControlApp, str]]:
    from rljob_cli.vllm_process import free_port

    control = ControlApp(controller)
    runner = web.AppRunner(control.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield control, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def server(controller: InferenceController) -> AsyncIterator[tuple[ControlApp, str]]:
    async with serving(controller) as s:
        yield s


class SkippingClock:
    """The client's retry clock: sleeping records the delay and jumps time forward at once."""

    def __init__(self) -> None:
        self.t = 0.0
        self.delays: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.t += seconds


def http_client_for(url: str, tmp_path: Path) -> InferenceControllerClient:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    return InferenceControllerClient(url, JOB, NS, token_file=token_file, holder="trainer-0", clock=SkippingClock())


@pytest.fixture
async def http_client(server: tuple[ControlApp, str], tmp_path: Path) -> AsyncIterator[InferenceControllerClient]:
    client = http_client_for(server[1], tmp_path)
    yield client
    await client.close()


@pytest.fixture(params=["http", "local"])
async def any_client(request: pytest.FixtureRequest, controller: InferenceController,
                     tmp_path: Path) -> AsyncIterator[ControllerClient]:
    """The same test against both transports."""
    if request.param == "local":
        yield LocalControllerClient(controller, holder="trainer-0")
        return
    async with serving(controller) as (_, url):
        client = http_client_for(url, tmp_path)
        try:
            yield client
        finally:
            await client.close()


async def test_window_ends_with_the_version_and_cells_serve(any_client: ControllerClient,
                                                           controller: InferenceController) -> None:
    async with any_client.update_weights(weight_version="1") as window:
        assert controller.lock.held
        assert sorted(e.cell for e in window.engines) == ["toy-cell-0", "toy-cell-1"]
        assert window.snapshot == {"toy-cell-0": 0, "toy-cell-1": 0}
        assert window.lock.holder == "trainer-0"
        window.weight_version = "7"  # the body may decide the version late
    assert not controller.lock.held
    assert controller.fleet.weight_version == "7"
    assert [(s.state, s.weight_version) for s in controller.engine_statuses()] == [(CellState.Serving, "7")] * 2
    cells = await any_client.cells()
    assert cells.weight_version == "7" and cells.lock is None
    assert len(cells.serving_endpoints) == 2


async def test_window_aborts_on_exception_and_reraises(any_client: ControllerClient,
                                                       controller: InferenceController) -> None:
    class PushFailed(Exception):
        pass

    with pytest.raises(PushFailed):
        async with any_client.update_weights(weight_version="1"):
            assert controller.lock.held
            raise PushFailed("engine refused the weights")
    assert not controller.lock.held
    assert controller.fleet.weight_version is None
    # participants may hold half-written weights: stopped and recreated at the next generation
    assert [s.generation for s in controller.engine_statuses()] == [1, 1]
    # the lock is free again: a retry can open a new window once cells are back
    await settle(controller)
    async with any_client.update_weights(weight_version="1"):
        pass
    assert controller.fleet.weight_version == "1"


async def test_second_window_while_one_is_open_is_lock_held(any_client: ControllerClient,
                                                            controller: InferenceController) -> None:
    async with any_client.update_weights():
        with pytest.raises(LockHeld):
            await any_client.start_update_weights("someone-else")
        with pytest.raises(LockHeld):  # memory moves are refused inside a window, not queued
            await any_client.offload([MemoryTag.kv_cache])
    assert controller.fleet.weight_version == "1"


async def test_memory_and_rollout_calls_reach_the_controller(any_client: ControllerClient,
                                                             controller: InferenceController) -> None:
    await any_client.prepare_rollout(3)
    assert controller.rollout_id == 3
    await any_client.offload([MemoryTag.kv_cache])
    assert all(s.memory == ["kv_cache"] for s in controller.engine_statuses())
    await any_client.onload_kv()
    assert all(s.memory == [] for s in controller.engine_statuses())
    cells = await any_client.cells()
    assert cells.rollout_id == 3 and [e.name for e in cells.engines] == ["toy-cell-0", "toy-cell-1"]


async def test_http_client_sends_the_token_file_and_retries_503_with_retry_after(
    server: tuple[ControlApp, str], http_client: InferenceControllerClient, controller: InferenceController
) -> None:
    control, _ = server
    control.standby_answers = 2
    await http_client.prepare_rollout(1)
    assert controller.rollout_id == 1
    assert http_client._clock.delays == [1.0, 1.0]  # type: ignore[attr-defined]
    assert set(control.seen_auth) == {f"Bearer {TOKEN}"}


async def test_http_client_sends_the_new_token_once_the_file_is_rotated(server: tuple[ControlApp, str],
                                                                      tmp_path: Path) -> None:
    control, url = server
    token_file = tmp_path / "token"
    token_file.write_text("token-1\n")
    control.tokens = {"token-1"}
    client = InferenceControllerClient(url, JOB, NS, token_file=token_file, clock=SkippingClock())
    try:
        await client.cells()
        await client.cells()
        rotate(token_file, "token-2")
        control.tokens = {"token-2"}  # the old token no longer passes (expired)
        await client.cells()
    finally:
        await client.close()
    assert control.seen_auth == ["Bearer token-1", "Bearer token-1", "Bearer token-2"]
    assert client._token_file is not None and client._token_file.reads == 2  # not once per call


async def test_http_client_rereads_the_token_after_a_401_and_repeats_the_call_once(server: tuple[ControlApp, str],
                                                                                  tmp_path: Path,
                                                                                  controller: InferenceController) -> None:
    """The kubelet rotated the token while a call was in flight: the controller refused the old
    one; the client reads the file again and the call goes through with the new token."""
    control, url = server
    token_file = tmp_path / "token"
    token_file.write_text("token-1\n")
    control.tokens = {"token-2"}
    control.on_refused = lambda: rotate(token_file, "token-2")
    client = InferenceControllerClient(url, JOB, NS, token_file=token_file, clock=SkippingClock())
    try:
        await client.prepare_rollout(5)
    finally:
        await client.close()
    assert control.seen_auth == ["Bearer token-1", "Bearer token-2"]
    assert controller.rollout_id == 5


async def test_http_client_raises_a_401_at_once_when_the_token_file_holds_no_newer_token(
    server: tuple[ControlApp, str], tmp_path: Path
) -> None:
    control, url = server
    token_file = tmp_path / "token"
    token_file.write_text("revoked\n")
    client = InferenceControllerClient(url, JOB, NS, token_file=token_file, clock=SkippingClock())
    try:
        with pytest.raises(ControllerUnauthorized):
            await client.cells()
    finally:
        await client.close()
    assert control.seen_auth == ["Bearer revoked"]  # one request: a 401 is not retried with the same token


async def test_http_client_gives_up_on_503_after_its_retry_deadline(server: tuple[ControlApp, str],
                                                                    tmp_path: Path) -> None:
    control, url = server
    control.standby_answers = 1000
    client = InferenceControllerClient(url, JOB, NS, token=TOKEN, retry_timeout=0.0, clock=SkippingClock())
    try:
        with pytest.raises(ControllerUnavailable) as err:
            await client.cells()
        assert err.value.status == 503 and err.value.reason == "NotLeader"
    finally:
        await client.close()


async def test_http_errors_are_typed(server: tuple[ControlApp, str], http_client: InferenceControllerClient) -> None:
    _, url = server
    bad = InferenceControllerClient(url, JOB, NS, token="wrong", token_file=None)
    missing = InferenceControllerClient(url, "nope", NS, token=TOKEN)
    try:
        with pytest.raises(ControllerUnauthorized):
            await bad.cells()
        with pytest.raises(ControllerNotFound):
            await missing.cells()
        window = await http_client.start_update_weights("trainer-0")
        with pytest.raises(ControllerLockHeld):
            await http_client.start_update_weights("trainer-1")
        with pytest.raises(ControllerSnapshotMismatch):
            await http_client.end_update_weights({"toy-cell-0": 99})
        await http_client.end_update_weights(window.snapshot, "1")
    finally:
        await bad.close()
        await missing.close()


async def test_unreachable_controller_is_unavailable_after_retries(tmp_path: Path) -> None:
    from rljob_cli.vllm_process import free_port

    clock = SkippingClock()
    client = InferenceControllerClient(f"http://127.0.0.1:{free_port()}", JOB, NS, token=TOKEN,
                                       retry_timeout=3.0, clock=clock)
    try:
        with pytest.raises(ControllerUnavailable) as err:
            await client.cells()
        assert err.value.reason == "Unreachable"
        assert clock.delays == [1.0, 1.0, 1.0]  # retried until the deadline, then gave up
    finally:
        await client.close()
