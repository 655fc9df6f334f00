"""The reference trainer's step order and weight-sync recovery, against a real controller on the fakes.

The controller is the real InferenceController over FakePlatform/FakeEngines, driven by a
background task that runs reconcile+probe passes; the executor and the policy are stand-ins
that record what was asked of them, so the order of calls can be checked exactly.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rljob_client.controller_client import LocalControllerClient
from rljob_client.trainbatch import TrainBatch
from rljob_client.trainer.loop import LoopConfig, TrainingLoop
from rljob_client.trainer.policy import StepMetrics

from controller_runtime.api.spec import InferenceSpec, MemoryTag
from controller_runtime.api.status import CellState
from controller_runtime.clock import FakeClock
from controller_runtime.controller import InferenceController
from controller_runtime.fakes import FakeEngines, FakePlatform, settle

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def eventually(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll a state that the controller's driver task changes, with a deadline."""
    deadline = asyncio.get_running_loop().time() + within
    for _ in itertools.count():
        if predicate():
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {within} s")
        await asyncio.sleep(0.002)


@dataclass
class Journal:
    calls: list[str] = field(default_factory=list)


class RecordingController(LocalControllerClient):
    def __init__(self, controller: InferenceController, journal: Journal) -> None:
        super().__init__(controller, holder="trainer-0")
        self.journal = journal

    async def prepare_rollout(self, rollout_id: int) -> None:
        self.journal.calls.append("prepare_rollout")
        await super().prepare_rollout(rollout_id)

    async def offload(self, tags: Any = None) -> Any:
        self.journal.calls.append(f"offload {','.join(map(str, tags))}")
        return await super().offload(tags)

    async def onload(self, tags: Any = None) -> Any:
        self.journal.calls.append(f"onload {','.join(map(str, tags))}")
        return await super().onload(tags)

    async def start_update_weights(self, holder: str) -> Any:
        self.journal.calls.append("start_update_weights")
        return await super().start_update_weights(holder)

    async def end_update_weights(self, snapshot: dict[str, int], weight_version: str | None = None) -> None:
        self.journal.calls.append(f"end_update_weights v{weight_version}")
        await super().end_update_weights(snapshot, weight_version)

    async def abort_update_weights(self, snapshot: dict[str, int]) -> list[str]:
        self.journal.calls.append("abort_update_weights")
        return await super().abort_update_weights(snapshot)


def batch() -> TrainBatch:
    n = 4
    return TrainBatch(arrays={
        "tokens": np.zeros((n, 3), np.int32), "response_mask": np.ones((n, 3), np.uint8),
        "prompt_lengths": np.ones(n, np.int32), "response_lengths": np.full(n, 2, np.int32),
        "rewards": np.array([0, 1, 0, 1], np.float32), "group_indices": np.array([0, 0, 1, 1], np.int32),
        "weight_versions": np.zeros(n, np.int64),
    }, rollout_id=0)


class Rollouts:
    """The executor stand-in: a batch is ready only while some engine serves (as the real one)."""

    def __init__(self, journal: Journal, controller: InferenceController) -> None:
        self.journal = journal
        self.controller = controller
        self.versions: list[int] = []

    async def get(self, rollout_id: int, rank: int, world_size: int) -> TrainBatch:
        self.journal.calls.append("get")
        await eventually(lambda: bool(self.controller.serving_endpoints()), within=10.0)
        return batch()

    async def set_weight_version(self, version: int) -> None:
        self.journal.calls.append(f"set_weight_version {version}")
        self.versions.append(version)


class Policy:
    def __init__(self, journal: Journal, model_dir: Path) -> None:
        self.journal = journal
        self.model = torch.nn.Linear(2, 2)
        self.model_dir = model_dir

    def train_step(self, b: TrainBatch) -> StepMetrics:
        self.journal.calls.append("train")
        return StepMetrics(0.0, float(np.mean(b.rewards)), 0.5, len(b), 8, 1.0, 0.001)


@dataclass
class Rig:
    controller: InferenceController
    platform: FakePlatform
    engines: FakeEngines
    journal: Journal
    loop: TrainingLoop
    rollouts: Rollouts


async def make_rig(tmp_path: Path, *, offload: bool = False, replicas: int = 1) -> AsyncIterator[Rig]:
    spec = InferenceSpec.model_validate({
        "replicas": replicas, "gpusPerEngine": 0,
        "restartPolicy": {"backoffSeconds": 0}, "offload": {"enabled": offload, "tags": ["weights", "kv_cache"]},
    })
    platform, engines = FakePlatform(), FakeEngines()
    controller = InferenceController("job", spec, platform, engines, clock=FakeClock(), serve_initial_weights=True)
    journal = Journal()
    source = tmp_path / "model"
    source.mkdir()
    (source / "config.json").write_text("{}")
    config = LoopConfig(steps=2, sync_dir=tmp_path / "sync", offload_tags=(MemoryTag.weights, MemoryTag.kv_cache) if offload else (),
                        retry_seconds=0.001, rejoin_check_seconds=0.01)
    rollouts = Rollouts(journal, controller)
    loop = TrainingLoop(config, RecordingController(controller, journal), rollouts, Policy(journal, source), engines)
    stop = asyncio.Event()

    async def drive() -> None:  # the controller's run loop, one pass at a time
        while not stop.is_set():
            await settle(controller, 1)
            await asyncio.sleep(0.002)

    driver = asyncio.create_task(drive())
    try:
        yield Rig(controller, platform, engines, journal, loop, rollouts)
    finally:
        stop.set()
        await driver


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async for r in make_rig(tmp_path):
        yield r


@pytest.fixture
async def colocated_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async for r in make_rig(tmp_path, offload=True):
        yield r


async def test_steps_follow_the_miles_order_and_versions_advance(rig: Rig) -> None:
    await eventually(lambda: bool(rig.controller.serving_endpoints()))  # the fleet is up: no waiting retries
    records = await rig.loop.run()
    assert rig.journal.calls == [
        "start_update_weights", "end_update_weights v0", "set_weight_version 0",
        "prepare_rollout", "get", "train", "start_update_weights", "end_update_weights v1", "set_weight_version 1",
        "prepare_rollout", "get", "train", "start_update_weights", "end_update_weights v2", "set_weight_version 2",
    ]
    assert [r.weight_version for r in records] == [1, 2]
    [engine] = rig.engines.engines.values()
    assert engine.calls.count("update_weights_from_disk") == 3
    assert engine.weight_version == "2" and not engine.paused
    assert rig.controller.weight_version == "2"
    assert sorted(p.name for p in rig.loop.writer.root.iterdir()) == ["v1", "v2"]


async def test_colocated_steps_offload_around_training(colocated_rig: Rig) -> None:
    await colocated_rig.loop.run()
    calls = colocated_rig.journal.calls
    first = calls.index("prepare_rollout")
    step = calls[first:first + 10]
    assert step == [
        "prepare_rollout", "get", "offload weights,kv_cache", "train", "onload weights",
        "start_update_weights", "end_update_weights v1", "set_weight_version 1", "onload kv_cache,cuda_graph",
        "prepare_rollout",
    ]


async def test_a_failed_push_aborts_the_window_and_retries_on_the_recreated_cell(rig: Rig) -> None:
    await rig.loop.sync_weights(0)
    [first] = rig.engines.engines.values()
    first.fail.add("update_weights_from_disk")
    attempts = await rig.loop.sync_weights(1)
    assert attempts == 2
    assert "abort_update_weights" in rig.journal.calls
    assert first.calls[-2:] == ["update_weights_from_disk", "resume"]  # never left paused
    assert rig.platform.generation_of("job-cell-0") == 1  # the participant was stopped and recreated
    [status] = rig.controller.engine_statuses()
    assert (status.state, status.weight_version) == (CellState.Serving, "1")


async def test_a_fleet_that_waits_for_weights_gets_the_current_version_pushed(rig: Rig) -> None:
    await rig.loop.sync_weights(0)
    await rig.loop.sync_weights(1)
    rig.platform.fail_pod("job-cell-0")  # the only engine dies; its replacement waits for weights
    await eventually(lambda: rig.platform.generation_of("job-cell-0") == 1
                     and rig.controller.engine_statuses()[0].state == CellState.PendingWeights)
    assert rig.controller.serving_endpoints() == []
    record = await rig.loop.step(1)  # would wait forever without the re-push
    assert record.weight_version == 2
    new = rig.engines.engines[FakePlatform.endpoint_of("job-cell-0", 1)]
    assert new.weight_version == "2"
    pushes = [c for c in rig.journal.calls if c.startswith("end_update_weights")]
    assert pushes == ["end_update_weights v0", "end_update_weights v1", "end_update_weights v1", "end_update_weights v2"]
