"""The gloo method inside real update windows: the InferenceController over local mode's
platform (one vLLM CPU process per cell), the trainer's window through LocalControllerClient,
and the DistributedTransport, as `rljob run` wires them.

An engine killed while the trainer broadcasts fails the push in bounded time; the window is
aborted (reason in the events, the cell stopped and recreated at the next generation, never
promoted to the new version), and the next window, over the recreated cell, succeeds with a
per-tensor check against the trainer's checksums.

The two tests share one controller and its cell (module scope): each fault recreates the cell,
so the second test starts from the first one's recreated, serving cell rather than paying for
one more vLLM CPU start-up (the CI budget).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from rljob_cli.local_platform import LocalPlatform, VLLMLauncher
from rljob_client.controller_client import LocalControllerClient
from rljob_client.weights.broadcast import VLLMReceiver, WeightTransferFailed
from rljob_client.weights.buckets import Bucket
from rljob_client.weights.process_group import DistributedTransport
from rljob_client.weights.transport import TransportContext

from controller_runtime.api.spec import InferenceSpec
from controller_runtime.api.status import CellState
from controller_runtime.clients import VLLMClient
from controller_runtime.controller import InferenceController
from controller_runtime.events import ControllerEvent, Reason
from tests.integration.test_weight_transfer_vllm import (
    _trainer_that_dies,
    clear_prompt,
    engine_greedy,
    trainer_model,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

JOB = "gloo-window"
TRANSFER_TIMEOUT_S = 10.0
CELL_DEADLINE_S = 300.0
LOCK_TIMEOUT_S = 30.0  # a window whose trainer died ends after this


@dataclass
class Fleet:
    controller: InferenceController
    platform: LocalPlatform
    events: list[ControllerEvent]
    client: LocalControllerClient


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> AsyncIterator[Fleet]:
    tmp_path = tmp_path_factory.mktemp("gloo-window")
    spec = InferenceSpec.model_validate({
        "replicas": 1, "gpusPerEngine": 0,
        "weightUpdate": {"method": "gloo", "transferTimeoutSeconds": TRANSFER_TIMEOUT_S, "bucketMegabytes": 1,
                         "lockTimeoutSeconds": LOCK_TIMEOUT_S},
        "healthCheck": {"intervalSeconds": 2, "timeoutSeconds": 5, "startupDeadlineSeconds": 600},
        "restartPolicy": {"backoffSeconds": 1, "maxBackoffSeconds": 2},
    })
    platform = LocalPlatform(VLLMLauncher(str(tiny_model_dir), tmp_path))
    events: list[ControllerEvent] = []
    controller = InferenceController(JOB, spec, platform, lambda endpoint: VLLMClient(endpoint, timeout=120.0),
                                     on_event=events.append, poll_seconds=1.0)
    stop = asyncio.Event()
    runner = asyncio.create_task(controller.run(stop))
    try:
        yield Fleet(controller, platform, events, LocalControllerClient(controller, holder="test-trainer"))
    finally:
        stop.set()
        await runner
        await platform.close()


async def wait_for_cell(fleet: Fleet, generation: int) -> None:
    """Until the cell of at least `generation` can take a window: started and waiting for its
    first weights, or serving (what the other test of the module leaves)."""
    deadline = time.monotonic() + CELL_DEADLINE_S
    while True:
        cell = fleet.controller.fleet.cells.get(f"{JOB}-cell-0")
        if cell is not None and cell.generation >= generation and cell.state in (CellState.PendingWeights,
                                                                                  CellState.Serving):
            return
        assert time.monotonic() < deadline, f"cell not PendingWeights or Serving at generation {generation}: {cell}"
        await asyncio.sleep(0.5)


class KilledWhenTheBroadcastStarts(VLLMReceiver):
    """SIGKILLs the engine's process group (API server and EngineCore) as the broadcast begins."""

    def __init__(self, client: VLLMClient, platform: LocalPlatform) -> None:
        super().__init__(client)
        self.platform = platform

    async def receive(self, buckets: Sequence[Bucket], version: str | None, timeout_s: float,
                      bucket_sent: Callable[[int], Awaitable[None]], digest: bool = False) -> None:
        pid = next(c.process.pid for c in self.platform.cells.values() if c.process.endpoint == self.endpoint)
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        await super().receive(buckets, version, timeout_s, bucket_sent, digest)


def transport(fleet: Fleet, *, kill: bool) -> DistributedTransport:
    def engines(endpoint: str) -> VLLMClient:
        return VLLMClient(endpoint, timeout=120.0)

    ctx = TransportContext(engines=engines, pause_mode=fleet.controller.spec.weight_update.pause_mode,
                           sync_dir=Path("/nonexistent"), source_model_dir=Path("/nonexistent"),
                           bucket_bytes=64 * 1024, transfer_timeout_seconds=TRANSFER_TIMEOUT_S, check_weights=True)
    if kill:
        return DistributedTransport(ctx, "gloo", receiver=lambda c: KilledWhenTheBroadcastStarts(c, fleet.platform))
    return DistributedTransport(ctx, "gloo")



async def assert_serves_the_trainers_weights(fleet: Any, model: Any, version: str) -> None:
    """The cell serves `version`, and its greedy output is the trainer model's own."""
    cell = fleet.controller.fleet.cells[f"{JOB}-cell-0"]
    assert cell.state is CellState.Serving and cell.weight_version == version
    engine = VLLMClient(cell.endpoint or "", timeout=120.0)
    try:
        prompt, expected = await asyncio.to_thread(clear_prompt, model)
        assert await engine_greedy(engine, prompt) == expected
    finally:
        await engine.close()

async def test_an_engine_killed_mid_broadcast_aborts_the_window_and_the_recreated_cell_takes_the_next(
    fleet: Fleet, tiny_model_dir: Path
) -> None:
    await wait_for_cell(fleet, 0)
    model = trainer_model(tiny_model_dir, seed=21)
    started = time.monotonic()
    with pytest.raises(WeightTransferFailed):
        async with fleet.client.update_weights(weight_version="1") as window:
            first = dict(window.snapshot)
            await transport(fleet, kill=True).push(window, 1, model)
    assert time.monotonic() - started < TRANSFER_TIMEOUT_S + 60.0
    aborted = [e for e in fleet.events if e.reason == Reason.WindowAborted]
    assert aborted and "test-trainer" in aborted[-1].message, [str(e) for e in fleet.events]
    assert fleet.controller.lock.current is None
    # the abort found the engine dead (its port refuses): the cell is healed like any dead one,
    # recreated and charged to its restart budget (not recreated uncharged as a live participant)
    await wait_for_cell(fleet, first[f"{JOB}-cell-0"] + 1)
    cell = fleet.controller.fleet.cells[f"{JOB}-cell-0"]
    assert cell.generation == first[f"{JOB}-cell-0"] + 1 and cell.weight_version != "1"
    assert cell.restarts == 1, [str(e) for e in fleet.events]

    # the next window: the recreated cell joins a fresh group and serves the trainer's weights
    await wait_for_cell(fleet, cell.generation)
    async with fleet.client.update_weights(weight_version="1") as window:
        assert window.snapshot == {f"{JOB}-cell-0": cell.generation}
        await transport(fleet, kill=False).push(window, 1, model)
        assert window.expected_checksums  # checked by tensor at end_update_weights
    await assert_serves_the_trainers_weights(fleet, model, "1")


async def test_a_trainer_that_dies_mid_broadcast_leaves_a_window_that_expires_and_the_next_one_succeeds(
    fleet: Fleet, tiny_model_dir: Path
) -> None:
    """The trainer opens a window, starts broadcasting and dies (no abort). The engine's receive
    fails within the transfer timeout and it stays paused; the controller aborts the window when
    its lock expires (LockExpired), recreates the half-updated cell, and a new trainer's window
    over the recreated cell succeeds."""
    await wait_for_cell(fleet, 0)
    cell = fleet.controller.fleet.cells[f"{JOB}-cell-0"]
    ctx = multiprocessing.get_context("spawn")
    done, loaded, go = ctx.Event(), ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_trainer_that_dies, args=(cell.endpoint, str(tiny_model_dir), 2, done, loaded, go))
    proc.start()
    try:
        assert await asyncio.to_thread(loaded.wait, 300), "the dying trainer did not load its model"
        window = await fleet.client.start_update_weights("dying-trainer")
    finally:
        go.set()
    await asyncio.to_thread(proc.join, 120)
    assert done.is_set() and proc.exitcode == 1
    deadline = time.monotonic() + LOCK_TIMEOUT_S + CELL_DEADLINE_S
    while fleet.controller.lock.current is not None or not any(e.reason == Reason.LockExpired for e in fleet.events):
        assert time.monotonic() < deadline, [str(e) for e in fleet.events]
        await asyncio.sleep(0.5)
    assert fleet.controller.fleet.cells[f"{JOB}-cell-0"].generation == window.snapshot[f"{JOB}-cell-0"] + 1

    model = trainer_model(tiny_model_dir, seed=22)
    await wait_for_cell(fleet, window.snapshot[f"{JOB}-cell-0"] + 1)
    async with fleet.client.update_weights(holder="new-trainer", weight_version="1") as next_window:
        await transport(fleet, kill=False).push(next_window, 1, model)
    await assert_serves_the_trainers_weights(fleet, model, "1")
