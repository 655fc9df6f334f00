"""The reference trainer's step order and weight-sync recovery, against a real controller on the fakes.

The controller is the real InferenceController over FakePlatform/FakeEngines, driven by a
background task that runs reconcile+probe passes; the executor and the policy are stand-ins
that record what was asked of them, so the order of calls can be checked exactly.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from rljob_client.controller_client import WINDOW_HOLDER_ENV, LocalControllerClient, default_holder
from rljob_client.publish import abort_orphan_window
from rljob_client.trainer.loop import LoopConfig, TrainingLoop, WeightSyncFailed
from rljob_client.trainer.policy import StepMetrics
from rljob_client.wire.trainbatch import TrainBatch
from rljob_operator.manifests import trainer_workload

from controller_runtime.api.spec import InferenceSpec, MemoryTag, RLJobSpec
from controller_runtime.api.status import CellState
from controller_runtime.clock import FakeClock
from controller_runtime.controller import InferenceController
from controller_runtime.errors import LockHeld
from controller_runtime.fakes import FakeEngine, FakeEngines, FakePlatform, settle

pytestmark = pytest.mark.asyncio(loop_scope="session")

TINY_CPU = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
TINY_CLUSTER = TINY_CPU.with_name("tiny-cluster.yaml")


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
        self.ready_timeouts: list[float | None] = []

    async def prepare_rollout(self, rollout_id: int) -> None:
        self.journal.calls.append("prepare_rollout")
        await super().prepare_rollout(rollout_id)

    async def offload(self, tags: Any = None) -> Any:
        self.journal.calls.append(f"offload {','.join(map(str, tags))}")
        return await super().offload(tags)

    async def onload(self, tags: Any = None) -> Any:
        self.journal.calls.append(f"onload {','.join(map(str, tags))}")
        return await super().onload(tags)

    async def start_update_weights(self, holder: str, ready_timeout: float | None = None) -> Any:
        self.journal.calls.append("start_update_weights")
        self.ready_timeouts.append(ready_timeout)
        return await super().start_update_weights(holder, ready_timeout)

    async def end_update_weights(self, snapshot: dict[str, int], weight_version: str | None = None,
                                 expected_checksums: dict[str, str] | None = None) -> None:
        self.journal.calls.append(f"end_update_weights v{weight_version}")
        await super().end_update_weights(snapshot, weight_version, expected_checksums)

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
        self.gate: list[str] = []  # the executor's begin/end weight update, apart from the step journal
        self.gate_journal_at: list[int] = []  # len(journal.calls) when each gate call came

    async def get(self, rollout_id: int, rank: int, world_size: int) -> TrainBatch:
        self.journal.calls.append("get")
        await eventually(lambda: bool(self.controller.serving_endpoints()), within=10.0)
        return batch()

    async def set_weight_version(self, version: int) -> None:
        self.journal.calls.append(f"set_weight_version {version}")
        self.versions.append(version)

    async def begin_weight_update(self) -> dict[str, Any]:
        self.gate.append("begin")
        self.gate_journal_at.append(len(self.journal.calls))
        return {"mode": "drain", "in_flight": 0}

    async def end_weight_update(self, version: int | None = None) -> int:
        self.gate.append(f"end {version}")
        self.gate_journal_at.append(len(self.journal.calls))
        return version or 0


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
    assert rig.controller.fleet.weight_version == "2"
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


def calls_but_probes(engine: FakeEngine) -> list[str]:
    """The engine's calls without health probes (the monitor's, or an abort looking for dead ones)."""
    return [c for c in engine.calls if c != "health"]


async def test_a_failed_push_aborts_the_window_and_retries_on_the_recreated_cell(rig: Rig) -> None:
    await rig.loop.sync_weights(0)
    [first] = rig.engines.engines.values()
    first.fail.add("update_weights_from_disk")
    attempts = await rig.loop.sync_weights(1)
    assert attempts == 2
    assert "abort_update_weights" in rig.journal.calls
    assert calls_but_probes(first)[-2:] == ["update_weights_from_disk", "resume"]  # never left paused
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


class Counting:
    """Wraps the fake engines: counts reloads in progress, optionally holds them until all engines are in."""

    def __init__(self, engines: FakeEngines, hold_for: int = 0) -> None:
        self.engines = engines
        self.hold_for = hold_for
        self.active = 0
        self.most = 0
        self.all_in = asyncio.Event()

    def __call__(self, endpoint: str) -> Any:
        inner = self.engines(endpoint)
        counting = self

        class Client:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            async def update_weights_from_disk(self, path: str, version: str | None = None) -> None:
                counting.active += 1
                counting.most = max(counting.most, counting.active)
                if counting.active >= counting.hold_for:
                    counting.all_in.set()
                try:
                    await asyncio.wait_for(counting.all_in.wait(), timeout=2.0)
                    await inner.update_weights_from_disk(path, version)
                finally:
                    counting.active -= 1

        return Client()


@pytest.fixture
async def fleet_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async for r in make_rig(tmp_path, replicas=3):
        yield r


async def test_a_window_pushes_to_all_engines_at_once(fleet_rig: Rig) -> None:
    """Issue 10 bug 6: engines were pushed one after the other (here: each reload waits for all three)."""
    rig = fleet_rig
    await eventually(lambda: len(rig.controller.serving_endpoints()) == 3)
    counting = Counting(rig.engines, hold_for=3)
    loop = TrainingLoop(rig.loop.config, rig.loop.controller, rig.rollouts, rig.loop.policy, counting)
    assert await loop.sync_weights(1) == 1
    assert counting.most == 3
    assert all(e.weight_version == "1" and not e.paused for e in rig.engines.engines.values())


async def test_one_failing_engine_aborts_the_window_and_leaves_no_engine_paused(fleet_rig: Rig) -> None:
    rig = fleet_rig
    await eventually(lambda: len(rig.controller.serving_endpoints()) == 3)
    bad = rig.engines.engines[FakePlatform.endpoint_of("job-cell-1", 0)]
    bad.fail.add("update_weights_from_disk")
    assert await rig.loop.sync_weights(1) == 2
    assert "abort_update_weights" in rig.journal.calls
    assert calls_but_probes(bad)[-2:] == ["update_weights_from_disk", "resume"] and not bad.paused
    others = [rig.engines.engines[FakePlatform.endpoint_of(f"job-cell-{i}", 0)] for i in (0, 2)]
    assert all(e.calls.count("resume") >= 1 and not e.paused for e in others)
    assert rig.controller.fleet.weight_version == "1"


async def test_each_sync_closes_the_executor_gate_around_the_window(rig: Rig) -> None:
    """Issue 10 bug 5: spec.rollout.onWeightUpdate did nothing, no one called begin/end_weight_update."""
    await eventually(lambda: bool(rig.controller.serving_endpoints()))
    await rig.loop.sync_weights(0)
    calls = rig.journal.calls
    assert rig.rollouts.gate == ["begin", "end 0"]
    begin_at, end_at = rig.rollouts.gate_journal_at
    assert calls[begin_at] == "start_update_weights"  # the gate closed before the window opened
    assert calls[end_at - 1] == "set_weight_version 0"  # and reopened once the executor knew the version
    [engine] = rig.engines.engines.values()
    engine.fail.add("update_weights_from_disk")
    loop = TrainingLoop(replace(rig.loop.config, max_update_attempts=1), rig.loop.controller, rig.rollouts,
                        rig.loop.policy, rig.engines)
    with pytest.raises(WeightSyncFailed):
        await loop.sync_weights(1)
    assert rig.rollouts.gate[-2:] == ["begin", "end None"], "a failed sync still reopens generation, on the old version"


async def test_the_window_waits_for_starting_cells_as_configured(rig: Rig) -> None:
    """Issue 10 bug 6: start_update_weights' ready_timeout was never passed."""
    await eventually(lambda: bool(rig.controller.serving_endpoints()))
    loop = TrainingLoop(replace(rig.loop.config, ready_timeout_seconds=7.0), rig.loop.controller, rig.rollouts,
                        rig.loop.policy, rig.engines)
    await loop.sync_weights(0)
    controller = rig.loop.controller
    assert isinstance(controller, RecordingController) and controller.ready_timeouts == [7.0]
    spec = RLJobSpec.model_validate(yaml.safe_load(TINY_CPU.read_text())["spec"])
    assert LoopConfig.from_spec(spec).ready_timeout_seconds == spec.inference.weight_update.ready_timeout_seconds == 60


def trainer_pod_holder(job: dict[str, Any], attempt: int, pod_name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The holder a trainer pod of `attempt` calls itself: the env the operator's manifest gives
    it, with HOSTNAME set to the pod's name as every container runtime sets it."""
    [_, trainer_job] = trainer_workload(job, "http://rljob-operator.rljob-system.svc:8443", attempt)
    env = {e["name"]: e["value"] for e in trainer_job["spec"]["template"]["spec"]["containers"][0]["env"]
           if "value" in e}
    with monkeypatch.context() as m:
        for name in ("POD_NAME", WINDOW_HOLDER_ENV):
            m.delenv(name, raising=False)
        m.setenv("HOSTNAME", pod_name)
        for name, value in env.items():
            m.setenv(name, value)
        return default_holder()


async def test_the_next_trainer_pod_aborts_the_window_its_killed_predecessor_left_open(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 killed inside a window leaves the lock held. The trainer Job's next pod has another
    name; it must still know the window as its own and abort it at once. Named by pod, it met
    LockHeld on its first push until the lock expired (lockTimeoutSeconds, 600 s by default),
    failing every restart meanwhile."""
    job = yaml.safe_load(TINY_CLUSTER.read_text())
    job["metadata"].update(namespace="rl", uid="0e9c1f50-5b1c-4a57-9d0a-6c2f3b1d7e11")  # as stored
    killed = trainer_pod_holder(job, 0, "tiny-cluster-trainer-0-x7k2p", monkeypatch)
    successor = trainer_pod_holder(job, 1, "tiny-cluster-trainer-0-9qwzt", monkeypatch)
    await eventually(lambda: bool(rig.controller.serving_endpoints()))
    await LocalControllerClient(rig.controller, killed).start_update_weights(killed)  # and never ends it
    client = LocalControllerClient(rig.controller, successor)
    with pytest.raises(LockHeld):
        await client.start_update_weights(successor)
    assert await abort_orphan_window(client, successor)
    # The lock is free at once; the window's engine, stopped by the abort, comes back to take weights.
    await eventually(lambda: rig.controller.engine_statuses()[0].state is CellState.PendingWeights)
    window = await client.start_update_weights(successor)
    await client.abort_update_weights(dict(window.snapshot))
    assert killed == successor == f"{job['metadata']['name']}-trainer"
