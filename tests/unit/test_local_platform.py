"""LocalPlatform's bookkeeping and local mode's capacity checks (no processes: a fake launcher)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from rljob_cli.capacity import GIB, LocalModeError, check_local_mode, local_mode_problems, max_cells
from rljob_cli.local_platform import LocalPlatform, observe_process

from controller_runtime.api.spec import InferenceSpec, RLJobManifest
from controller_runtime.ports import CellRequest


@dataclass
class FakeProcess:
    endpoint: str
    pid: int | None = None
    started: bool = False
    stopped: bool = False
    exit_code: int | None = None

    def start(self) -> None:
        self.started = True

    def returncode(self) -> int | None:
        return self.exit_code

    def stop(self, timeout: float = 15.0) -> bool:
        self.stopped = True
        return True


@dataclass
class FakeLauncher:
    made: list[tuple[CellRequest, FakeProcess]] = field(default_factory=list)

    def __call__(self, request: CellRequest) -> FakeProcess:
        proc = FakeProcess(f"http://127.0.0.1:{9000 + len(self.made)}", pid=1000 + len(self.made))
        self.made.append((request, proc))
        return proc


def request(index: int = 0, generation: int = 0) -> CellRequest:
    return CellRequest(name=f"job-cell-{index}", index=index, generation=generation)


async def test_create_is_idempotent_per_generation() -> None:
    launcher = FakeLauncher()
    spawned: list[tuple[str, int | None]] = []
    platform = LocalPlatform(launcher, on_spawn=lambda name, pid: spawned.append((name, pid)))
    await platform.create_cell(request())
    await platform.create_cell(request())
    assert len(launcher.made) == 1 and launcher.made[0][1].started
    assert spawned == [("job-cell-0-g0", 1000)]
    [obs] = await platform.observe_cells()
    assert (obs.name, obs.generation, obs.endpoint) == ("job-cell-0", 0, "http://127.0.0.1:9000")
    assert obs.all_running and not obs.any_failed


async def test_a_newer_generation_replaces_the_old_process_and_an_older_one_is_ignored() -> None:
    launcher = FakeLauncher()
    platform = LocalPlatform(launcher)
    await platform.create_cell(request(generation=0))
    await platform.create_cell(request(generation=1))
    old, new = launcher.made[0][1], launcher.made[1][1]
    assert old.stopped and new.started and not new.stopped
    await platform.create_cell(request(generation=0))  # a stale retry must not resurrect gen 0
    assert len(launcher.made) == 2
    [obs] = await platform.observe_cells()
    assert obs.generation == 1 and obs.endpoint == new.endpoint


async def test_an_exited_engine_is_observed_as_a_failed_pod() -> None:
    launcher = FakeLauncher()
    platform = LocalPlatform(launcher)
    await platform.create_cell(request())
    launcher.made[0][1].exit_code = -9
    [obs] = await platform.observe_cells()
    assert obs.any_failed
    assert obs.pods[0].phase == "Failed" and "code -9" in obs.pods[0].message
    assert observe_process("p", 0).phase == "Succeeded"  # exiting at all ends an engine


async def test_delete_stops_the_process_and_leaves_the_serving_set() -> None:
    launcher = FakeLauncher()
    platform = LocalPlatform(launcher)
    await platform.create_cell(request(0))
    await platform.create_cell(request(1))
    await platform.set_serving("job-cell-0", True)
    await platform.set_serving("job-cell-1", True)
    assert platform.serving_endpoints() == ["http://127.0.0.1:9000", "http://127.0.0.1:9001"]
    await platform.delete_cell("job-cell-0")
    await platform.delete_cell("job-cell-0")  # idempotent
    assert launcher.made[0][1].stopped
    assert platform.serving_endpoints() == ["http://127.0.0.1:9001"]
    assert [o.name for o in await platform.observe_cells()] == ["job-cell-1"]
    await platform.set_serving("job-cell-0", True)  # a deleted cell cannot come back by label
    assert platform.serving_endpoints() == ["http://127.0.0.1:9001"]
    await platform.close()
    assert launcher.made[1][1].stopped and await platform.observe_cells() == []


def manifest(**inference: object) -> RLJobManifest:
    return RLJobManifest.model_validate({
        "metadata": {"name": "t"},
        "spec": {
            "model": {"path": "/m"},
            "inference": {"gpusPerEngine": 0, **inference},
            "rollout": {"dataset": {"path": "/d.jsonl"}},
            "trainer": {"gpusPerReplica": 0},
        },
    })


def test_a_cpu_job_that_fits_has_no_problems() -> None:
    assert local_mode_problems(manifest(replicas=1).spec, 20 * GIB) == []


def test_gpu_engines_are_refused_with_the_scale_down_hint() -> None:
    with pytest.raises(LocalModeError) as err:
        check_local_mode(manifest(gpusPerEngine=8, replicas=4).spec, 20 * GIB)
    text = str(err.value)
    assert "spec.inference.gpusPerEngine is 8" in text
    assert "gpusPerEngine: 0" in text and "replicas: 1" in text


def test_more_cells_than_memory_allows_names_the_replicas_that_fit() -> None:
    problems = local_mode_problems(manifest(replicas=10).spec, 12 * GIB)
    assert len(problems) == 1
    assert "spec.inference.replicas is 10" in problems[0]
    assert f"replicas: {max_cells(12 * GIB)}" in problems[0]
    assert max_cells(12 * GIB) == 3  # (12 - 1.5) / 3.3


def test_trainer_fields_local_mode_cannot_honour_are_named() -> None:
    spec = manifest().spec.model_copy(update={"trainer": manifest().spec.trainer.model_copy(
        update={"gpus_per_replica": 8, "replicas": 8})})  # 2 ranks run locally since issue 10; 8 do not
    text = "\n".join(local_mode_problems(spec, 20 * GIB))
    assert "spec.trainer.gpusPerReplica is 8" in text and "spec.trainer.replicas is 8" in text


def test_two_trainer_ranks_fit_a_two_core_machine() -> None:
    spec = manifest().spec.model_copy(update={"trainer": manifest().spec.trainer.model_copy(update={"replicas": 2})})
    assert local_mode_problems(spec, 8 * GIB) == []
    problems = local_mode_problems(spec, int(5.2 * GIB))  # 1 engine + the rest fit, the second rank does not
    assert len(problems) == 1 and "per trainer rank beyond the first" in problems[0]


def test_sglang_is_refused() -> None:
    spec = manifest().spec
    spec = spec.model_copy(update={"inference": InferenceSpec(engine="sglang", gpus_per_engine=0)})
    assert any("vLLM" in p for p in local_mode_problems(spec, 20 * GIB))
