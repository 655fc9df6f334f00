"""Several trainer ranks (real processes, gloo on loopback) against a real controller (issue 10).

The test process holds the InferenceController over LocalPlatform with stand-in engine
processes (tests/engine_standin), serves it over local mode's HTTP controller API, and runs a
real RolloutExecutor (maxStaleness 0) behind a small HTTP shim. Each rank is
`tests/integration/trainer_rank.py`: the real TrainingLoop, StoreRanks, the HTTP client, the
disk transport. Bugs it pins: a second rank crashed on LockHeld (bug 1), ranks trained on
rollouts of the previous weights (bug 2), and a dead rank left the others hanging.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from aiohttp import web
from rljob_cli.local_api import LocalControlAPI
from rljob_cli.local_platform import LocalPlatform
from rljob_cli.vllm_process import free_port
from rljob_client.controller_client import LocalControllerClient
from rljob_client.trainer.loop import LoopConfig, TrainingLoop
from rljob_client.wire.trainbatch import encode_bytes
from rollout_executor.config import ExecutorConfig
from rollout_executor.executor import RolloutExecutor

from controller_runtime.api.spec import InferenceSpec
from controller_runtime.controller import InferenceController
from controller_runtime.ports import CellRequest

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "engine_standin" / "rljob_engine_standin.py"
RANK = ROOT / "tests" / "integration" / "trainer_rank.py"
JOB, NAMESPACE = "ranks", "default"
STEPS = 3
RANKS_TIMEOUT = 240.0  # the whole multi-rank run; a hang fails here, not in CI's global timeout
DEAD_RANK_BOUND = 45.0  # a peer's death must be reported within this long


class StandInProcess:
    """One cell generation as a stand-in engine process (LocalPlatform's EngineProcess)."""

    def __init__(self, log_path: Path, delay: float) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.delay = delay
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        out = self.log_path.open("wb")
        argv = [sys.executable, str(STANDIN), "--host", "127.0.0.1", "--port", str(self.port),
                "--standin-delay", str(self.delay)]
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def stop(self, timeout: float = 15.0) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return True
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=timeout)
        return True


class ExecutorShim:
    """The executor's calls over plain HTTP (the ranks are not Ray drivers here)."""

    def __init__(self, executor: RolloutExecutor) -> None:
        self.executor = executor
        self.gate_calls: list[str] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/get/{rid}/{rank}/{world}", self._get)
        app.router.add_post("/{what}", self._post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"

    async def _get(self, r: web.Request) -> web.Response:
        i = r.match_info
        shard = await self.executor.get(int(i["rid"]), int(i["rank"]), int(i["world"]))
        return web.Response(body=encode_bytes(shard))

    async def _post(self, r: web.Request) -> web.Response:
        what, version = r.match_info["what"], (await r.json()).get("version")
        self.gate_calls.append(f"{what} {version}")
        if what == "set_weight_version":
            out: Any = self.executor.set_weight_version(version)
        elif what == "begin_weight_update":
            out = await self.executor.begin_weight_update()
        elif what == "end_weight_update":
            out = await self.executor.end_weight_update(version)
        else:
            raise web.HTTPNotFound()
        return web.json_response(out)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class Rig:
    tmp: Path
    controller: InferenceController
    api: LocalControlAPI
    executor: RolloutExecutor
    shim: ExecutorShim
    executor_url: str
    model_dir: Path


@pytest.fixture
def standin_delay() -> float:
    """Seconds each stand-in completion takes (a test that needs requests in flight raises it)."""
    return 0.02


@pytest.fixture
def on_weight_update() -> str:
    return "drain"


@pytest_asyncio.fixture(loop_scope="function")
async def rig(tmp_path: Path, standin_delay: float, on_weight_update: str) -> AsyncIterator[Rig]:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"vocab_size": 1000}')
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(64)))

    def launch(request: CellRequest) -> StandInProcess:
        return StandInProcess(tmp_path / f"{request.name}-g{request.generation}.log", delay=standin_delay)

    spec = InferenceSpec.model_validate({"replicas": 2, "gpusPerEngine": 0,
                                         "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 5}})
    platform = LocalPlatform(launch, stop_timeout=5.0)
    controller = InferenceController(JOB, spec, platform, lambda ep: _engine(ep), serve_initial_weights=True,
                                     poll_seconds=0.2)
    stop = asyncio.Event()
    driver = asyncio.create_task(controller.run(stop))
    api = LocalControlAPI(controller, JOB, NAMESPACE, tmp_path / "controller.token")
    await api.start()

    async def serving() -> list[str]:
        return controller.serving_endpoints()

    executor = RolloutExecutor(ExecutorConfig(
        job=JOB, dataset_path=str(dataset), model=str(model_dir), tokenizer_path=str(model_dir),
        n_samples_per_prompt=2, batch_size=8, max_tokens=4, max_staleness=0,
        reward_function="rollout_executor.rewards:token_set_fraction", reward_args={"size": 100, "seed": 0},
        concurrency=4, no_engine_timeout_seconds=60, on_weight_update=on_weight_update,
    ), endpoints_provider=serving)
    await executor.start()
    shim = ExecutorShim(executor)
    url = await shim.start()
    try:
        yield Rig(tmp_path, controller, api, executor, shim, url, model_dir)
    finally:
        await shim.close()
        await executor.close()
        await api.close()
        stop.set()
        await driver
        await platform.close()
        await controller.close()


def _engine(endpoint: str) -> Any:
    from controller_runtime.api.spec import Engine
    from controller_runtime.clients.factory import make_engine_client

    return make_engine_client(Engine.vllm, endpoint)


@dataclass
class RankResult:
    rank: int
    code: int | None
    stderr: str
    seconds: float


async def run_ranks(rig: Rig, world: int, *, die_at: str | None = None,
                    within: float = RANKS_TIMEOUT) -> list[RankResult]:
    port = free_port()
    procs = []
    started = time.monotonic()
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   RLJOB_CONTROLLER_URL=rig.api.url, RLJOB_NAME=JOB, RLJOB_NAMESPACE=NAMESPACE,
                   RLJOB_CONTROLLER_TOKEN_FILE=str(rig.api.token_file), EXECUTOR_URL=rig.executor_url,
                   SYNC_DIR=str(rig.tmp / "sync"), MODEL_DIR=str(rig.model_dir), STEPS=str(STEPS),
                   OUT_DIR=str(rig.tmp), PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   **({"DIE_AT": die_at} if die_at else {}))
        procs.append(await asyncio.create_subprocess_exec(sys.executable, str(RANK), env=env,
                                                          stdout=asyncio.subprocess.DEVNULL,
                                                          stderr=asyncio.subprocess.PIPE))

    async def one(rank: int, proc: asyncio.subprocess.Process) -> RankResult:
        assert proc.stderr is not None
        try:
            err = await asyncio.wait_for(proc.stderr.read(), timeout=within)
            code = await asyncio.wait_for(proc.wait(), timeout=10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return RankResult(rank, None, "<hung: killed by the test>", time.monotonic() - started)
        return RankResult(rank, code, err.decode(errors="replace"), time.monotonic() - started)

    return list(await asyncio.gather(*(one(r, p) for r, p in enumerate(procs))))


@pytest.mark.parametrize("world", [2, 4])
async def test_ranks_train_on_exactly_the_version_each_step_expects(rig: Rig, world: int) -> None:
    results = await run_ranks(rig, world)
    for r in results:
        assert r.code == 0, f"rank {r.rank} exited {r.code}:\n{r.stderr[-3000:]}"
    for rank in range(world):
        records = json.loads((rig.tmp / f"rank{rank}.json").read_text())
        assert [rec["step"] for rec in records] == list(range(STEPS))
        # maxStaleness 0 and the barrier: step s trains only on samples of weights v s
        assert [rec["batch_weight_versions"] for rec in records] == [[s] for s in range(STEPS)], f"rank {rank}"
    assert rig.controller.fleet.weight_version == str(STEPS)
    assert rig.executor.versions.current == STEPS
    assert rig.executor.versions.dropped_samples == 0, "no rank asked for a rollout before its weights were live"
    begins = [c for c in rig.shim.gate_calls if c.startswith("begin_weight_update")]
    assert len(begins) == STEPS + 1, "rank 0 (only) closed the executor's gate around every window"


@pytest.mark.parametrize(("die_at", "dead", "survivor"), [
    ("1:1", 1, 0),  # rank 1 dies in training: rank 0's all-reduce fails
    ("0:1", 0, 1),  # rank 0 dies in training: rank 1's all-reduce fails
    ("0:1:push", 0, 1),  # rank 0 dies pushing weights: rank 1 waits at the barrier for a version that never comes
])
async def test_a_rank_that_dies_mid_step_fails_the_others_naming_it(rig: Rig, die_at: str, dead: int,
                                                                   survivor: int) -> None:
    results = await run_ranks(rig, 2, die_at=die_at, within=DEAD_RANK_BOUND + 60)
    by_rank = {r.rank: r for r in results}
    assert by_rank[dead].code == 17, by_rank[dead].stderr[-2000:]
    alive = by_rank[survivor]
    print(f"rank {survivor} after {alive.seconds:.1f} s: {alive.stderr.split('RANK FAILED:')[-1].strip()[:600]}")
    assert alive.code == 3, f"rank {survivor} should fail with RankFailed, got {alive.code}:\n{alive.stderr[-3000:]}"
    assert f"rank {dead}" in alive.stderr.split("RANK FAILED:")[-1], alive.stderr[-3000:]
    assert alive.seconds < DEAD_RANK_BOUND + 30, f"took {alive.seconds:.0f} s"


class ExecutorSource:
    """The in-process executor as the loop's RolloutSource; keeps what each gate close answered."""

    def __init__(self, executor: RolloutExecutor) -> None:
        self.executor = executor
        self.begins: list[dict[str, Any]] = []
        self.old_samples_at_begin: list[int] = []

    async def get(self, rollout_id: int, rank: int, world_size: int) -> Any:
        return await self.executor.get(rollout_id, rank, world_size)

    async def set_weight_version(self, version: int) -> None:
        self.executor.set_weight_version(version)

    async def begin_weight_update(self) -> dict[str, Any]:
        answer = await self.executor.begin_weight_update()
        self.begins.append(answer)
        ro = self.executor.rollouts.get(0)
        old = self.executor.versions.current
        self.old_samples_at_begin.append(sum(1 for x in ro.samples.values() if x.weight_version == old) if ro else 0)
        return answer

    async def end_weight_update(self, version: int | None = None) -> int:
        return await self.executor.end_weight_update(version)


class NoPolicy:
    """The loop only needs a model to stage; nothing trains in this test."""

    def __init__(self, model_dir: Path) -> None:
        self.model = torch.nn.Linear(2, 2)
        self.model_dir = model_dir


@pytest.mark.parametrize("standin_delay", [0.5])
@pytest.mark.parametrize("on_weight_update", ["drain", "abort"])
async def test_the_loop_drains_or_aborts_in_flight_requests_around_its_window(rig: Rig, on_weight_update: str) -> None:
    """Issue 10 bug 5: spec.rollout.onWeightUpdate did nothing; the loop now closes the executor's gate around every window."""
    source = ExecutorSource(rig.executor)
    config = LoopConfig(steps=1, sync_dir=rig.tmp / "sync-gate", holder="trainer-0", ready_timeout_seconds=10.0,
                        retry_seconds=0.2, fleet_timeout_seconds=60.0)
    loop = TrainingLoop(config, LocalControllerClient(rig.controller, holder="trainer-0"), source,
                        NoPolicy(rig.model_dir), _engine)  # type: ignore[arg-type]
    await loop.sync_weights(0)  # the fleet up, every engine on v0; nothing in flight yet
    assert source.begins[0]["in_flight"] == 0
    rig.executor.generate(0)
    await until(lambda: rig.executor.stats()["in_flight"] >= 2, what="requests in flight")
    await loop.sync_weights(1)
    window = source.begins[1]
    assert window["mode"] == on_weight_update and window["in_flight"] >= 2
    stats = rig.executor.stats()
    if on_weight_update == "drain":  # the in-flight requests finished, on the old weights
        assert stats["aborted_retries"] == 0
        assert source.old_samples_at_begin[1] >= window["in_flight"]
    else:  # cancelled, and retried once the gate reopened at v1
        assert stats["aborted_retries"] == window["in_flight"]
    batch = await rig.executor.get_batch(0)
    assert set(batch.weight_versions.tolist()) == {1}, "maxStaleness 0: the batch is of the new weights only"
    assert rig.controller.fleet.weight_version == "1"


async def until(cond: Any, within: float = 30.0, what: str = "condition") -> None:
    """Poll state another task changes, with a deadline."""
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
