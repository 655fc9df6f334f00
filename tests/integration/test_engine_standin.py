"""The tests' one stand-in engine (tests/engine_standin), started the way an engine pod starts
it, speaks what the controller's VLLMClient and the executor's Generator expect.

Every cluster test that uses stand-in cells relies on this; here it is checked in seconds,
without a cluster: the pod's unchanged `python -m vllm.entrypoints.openai.api_server ...`
with the directory on PYTHONPATH, and the pod name the operator gives a cell's pod.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from rollout_executor.generation import EnginePool, Generator, SamplingParams, WeightGate, static_endpoints
from rollout_executor.samples import SampleKey

from controller_runtime.api.spec import MemoryTag
from controller_runtime.clients.vllm import VLLMClient
from controller_runtime.errors import EngineHTTPError
from tests.cluster.fixtures import wait_for
from tests.integration.operator_harness import STANDIN_DIR, free_port

REPO = Path(__file__).resolve().parents[2]
VLLM_COMMAND = ["-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny", "--dtype=bfloat16"]


def start_pod_process(tmp: Path, pod_name: str, **env: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log = tmp / f"{pod_name}.log"
    full_env = {**os.environ, "PYTHONPATH": str(STANDIN_DIR), "POD_NAME": pod_name, "POD_IP": "127.0.0.1", **env}
    full_env.pop("RLJOB_STANDIN_CHILD", None)
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, *VLLM_COMMAND, "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)  # fmt: skip
    return proc, f"http://127.0.0.1:{port}", log


@pytest.fixture
def standin_cell(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    proc, url, log = start_pod_process(tmp_path, "job-cell-1-g0-0", RLJOB_STANDIN_CELLS="0,1")
    try:
        wait_for(lambda: "serving on" in log.read_text() or proc.poll() is not None, 30, what="stand-in listening")
        assert proc.poll() is None, log.read_text()
        yield url, log
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def test_standin_answers_every_engine_client_call(standin_cell: tuple[str, Path]) -> None:
    url, _ = standin_cell
    client = VLLMClient(url)
    try:
        await client.health()
        assert (await client.metrics())["vllm:num_requests_running"] == 0
        await client.pause()
        assert await client.is_paused()
        with pytest.raises(EngineHTTPError):  # a paused engine takes no new request
            await client.completions([1, 2], max_tokens=2, temperature=1.0)
        await client.resume()
        await client.release_memory([MemoryTag.weights])
        assert await client.is_sleeping()
        await client.resume_memory([MemoryTag.weights, MemoryTag.kv_cache])
        assert not await client.is_sleeping()
        await client.release_memory([MemoryTag.kv_cache])
        await client.flush_cache()
        await client.abort_all()
        await client.update_weights_from_disk("/ckpt/step-1", version="1")
        assert await client.get_weight_version() == "1"
        assert await client.weight_checksums() == {"rank0": "standin-1"}
        reply = await client.completions([1, 2], max_tokens=3, temperature=1.0, n=2)
        assert [len(c.token_ids) for c in reply.choices] == [3, 3]
        assert all(c.logprobs is not None and len(c.logprobs) == 3 for c in reply.choices)
    finally:
        await client.close()


async def test_standin_serves_the_executor_and_logs_each_request(standin_cell: tuple[str, Path]) -> None:
    url, log = standin_cell
    async with aiohttp.ClientSession() as session:
        gen = Generator(EnginePool(static_endpoints([url]), concurrency=2), WeightGate(), SamplingParams(max_tokens=4), session)
        done = await asyncio.gather(*(gen.complete(SampleKey(0, 0, i), "hi") for i in range(3)))
    assert all(len(c.token_ids) == len(c.logprobs) == 4 and c.prompt_token_ids for c in done)
    assert log.read_text().count("request ") == 3


async def test_standin_health_fails_on_demand_while_the_process_lives(standin_cell: tuple[str, Path]) -> None:
    url, _ = standin_cell
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/standin/unhealthy") as r:
            assert r.status == 200
        async with session.get(f"{url}/health") as r:
            assert r.status == 503


def test_a_crash_cell_exits_at_once_and_a_gated_cell_starts_once_its_file_exists(tmp_path: Path) -> None:
    crash, _, log = start_pod_process(tmp_path, "job-cell-0-g0-0", RLJOB_CRASH_CELLS="0", RLJOB_STANDIN_CELLS="all")
    assert crash.wait(timeout=30) == 1, log.read_text()
    assert "crash-loop stand-in: cell 0 exits" in log.read_text()

    gate = tmp_path / "gate"
    gate.mkdir()
    gated, _, log = start_pod_process(tmp_path, "job-cell-2-g1-0", RLJOB_STANDIN_CELLS="all", RLJOB_STANDIN_GATE=str(gate))
    try:
        (gate / "cell-2").touch()
        wait_for(lambda: "serving on" in log.read_text() or gated.poll() is not None, 30, what="gated cell listening")
        assert gated.poll() is None, log.read_text()
    finally:
        gated.kill()
        gated.wait(timeout=10)
