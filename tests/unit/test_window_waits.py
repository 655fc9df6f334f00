"""The controller API's waits, over HTTP (local mode's server and the HTTP client) and in-process (issue 10).

- `prepare_rollout` during an open window waits for it to close instead of answering LockHeld
  (bug 1: a second rank died on that 409), and gives up after `waitSeconds` naming the holder;
- `start_update_weights` takes `readyTimeoutSeconds` and waits for cells that are starting
  (bug 6: it was never passed, so a window covered only the cells ready at that instant).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from rljob_cli.local_api import LocalControlAPI
from rljob_client.controller_client import ControllerClient, InferenceControllerClient, LocalControllerClient

from controller_runtime.api.spec import InferenceSpec
from controller_runtime.api.status import CellState
from controller_runtime.controller import InferenceController
from controller_runtime.errors import LockHeld
from controller_runtime.fakes import FakeEngines, FakePlatform

JOB, NAMESPACE = "job", "default"


@dataclass
class Served:
    controller: InferenceController
    engines: FakeEngines
    http: InferenceControllerClient
    local: LocalControllerClient


@pytest_asyncio.fixture(loop_scope="function")
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    spec = InferenceSpec.model_validate({"replicas": 2, "gpusPerEngine": 0, "healthCheck": {"intervalSeconds": 0.05}})
    engines = FakeEngines()
    gate = asyncio.Event()
    engines(FakePlatform.endpoint_of(f"{JOB}-cell-1", 0)).health_gate = gate  # cell-1 starts only when the test says
    controller = InferenceController(JOB, spec, FakePlatform(), engines, poll_seconds=0.05)
    stop = asyncio.Event()
    driver = asyncio.create_task(controller.run(stop))
    api = LocalControlAPI(controller, JOB, NAMESPACE, tmp_path / "token")
    await api.start()
    http = InferenceControllerClient(api.url, JOB, NAMESPACE, token_file=api.token_file, holder="http-trainer")
    try:
        yield Served(controller, engines, http, LocalControllerClient(controller, holder="local-trainer"))
    finally:
        gate.set()
        await http.close()
        await api.close()
        stop.set()
        await driver


def open_gate(s: Served) -> None:
    gate = s.engines.engines[FakePlatform.endpoint_of(f"{JOB}-cell-1", 0)].health_gate
    assert gate is not None
    gate.set()


async def eventually(predicate: object, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "not true in time"
        await asyncio.sleep(0.01)


def ready(s: Served) -> bool:
    return all(c.state in (CellState.PendingWeights, CellState.Serving) for c in s.controller.fleet.cells.values())


@pytest.mark.parametrize("via", ["http", "local"])
async def test_the_window_waits_for_a_starting_cell(served: Served, via: str) -> None:
    client: ControllerClient = served.http if via == "http" else served.local
    opening = asyncio.ensure_future(client.start_update_weights("trainer-0", ready_timeout=10.0))
    await asyncio.sleep(0.2)  # the window is now waiting (the test's pause, not a wait for state)
    assert not opening.done()
    open_gate(served)
    window = await asyncio.wait_for(opening, timeout=10.0)
    assert [e.cell for e in window.engines] == [f"{JOB}-cell-0", f"{JOB}-cell-1"]
    await client.end_update_weights(window.snapshot, "1")


@pytest.mark.parametrize("via", ["http", "local"])
async def test_prepare_rollout_waits_for_the_window_then_goes_through(served: Served, via: str) -> None:
    client: ControllerClient = served.http if via == "http" else served.local
    open_gate(served)
    await eventually(lambda: ready(served))
    window = await served.local.start_update_weights("writer-rank-0")
    preparing = asyncio.ensure_future(client.prepare_rollout(5))
    await asyncio.sleep(0.2)
    assert not preparing.done() and served.controller.rollout_id is None
    await served.local.end_update_weights(window.snapshot, "1")
    await asyncio.wait_for(preparing, timeout=10.0)
    assert served.controller.rollout_id == 5


@pytest.mark.parametrize("via", ["http", "local"])
async def test_prepare_rollout_gives_up_naming_the_holder(served: Served, via: str) -> None:
    client: ControllerClient = served.http if via == "http" else served.local
    open_gate(served)
    await eventually(lambda: ready(served))
    await served.local.start_update_weights("writer-rank-0")
    with pytest.raises(LockHeld, match=r"waited 0\.3 s for the update window of 'writer-rank-0'"):
        await client.prepare_rollout(5, wait_seconds=0.3)
