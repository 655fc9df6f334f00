"""The gloo weight transfer against the real vLLM CPU server (the session's shared `vllm_server`,
started with the rljob worker extension like every local-mode engine).

Every test leaves the shared server as it found it: resumed, original weights (restored by
reload from the seed-0 directory), out of any group. Fault tests bound every wait with a
short transfer timeout and check the engine afterwards: still paused when it may hold half
an update (so it serves nothing half-updated), out of the broken group, and able to take the
next update.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from rljob_client.controller_client import WeightUpdateWindow
from rljob_client.weights.broadcast import (
    GroupAddress,
    VLLMReceiver,
    WeightBroadcaster,
    WeightTransferFailed,
    expected_checksums,
    named_tensors,
)
from rljob_client.weights.buckets import Bucket
from rljob_client.weights.disk import DiskWeightWriter
from rljob_client.weights.process_group import DistributedTransport
from rljob_client.weights.transport import TransportContext

from controller_runtime.api.control import EngineEndpoint
from controller_runtime.api.spec import PauseMode
from controller_runtime.api.status import LockStatus
from controller_runtime.clients import VLLMClient
from tests.fixtures.vllm_server import VLLMServer, start_vllm_server, stop_vllm_server

pytestmark = pytest.mark.vllm

TIMEOUT_S = 120.0
TRANSFER_TIMEOUT_S = 8.0  # faults must end within this (plus the calls' margins)
GREEDY_TOKENS = 8
CANDIDATES = [[1, 20 + 7 * i % 900, 300 + 11 * i % 600, 40 + i] for i in range(300)]


@pytest_asyncio.fixture(loop_scope="function")
async def vllm(vllm_server: VLLMServer, tiny_model_dir: Path) -> AsyncIterator[VLLMClient]:
    client = VLLMClient(vllm_server.endpoint, timeout=TIMEOUT_S)
    base = await client.weight_checksums()
    try:
        yield client
    finally:  # back to the shared server's state, whatever the test did
        with contextlib.suppress(Exception):
            await client.close_weight_transfer()
        await client.resume()
        if await client.weight_checksums() != base:
            await client.reload_weights(str(tiny_model_dir))
        assert await client.weight_checksums() == base
        await client.close()


def trainer_model(model_dir: Path, seed: int) -> torch.nn.Module:
    """The trainer's policy as PolicyTrainer holds it (float32), nudged so that it is a model
    no checkpoint on disk has: the update must carry every tensor."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g) * p.abs().mean())
    return model


def trainer_greedy(model: torch.nn.Module, prompt: list[int]) -> tuple[tuple[int, ...], float]:
    """The trainer's own greedy tokens over the weights it sends (bf16, computed in float32),
    and the smallest top-1/top-2 gap on the way."""
    import copy

    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
        ids, margin = list(prompt), float("inf")
        for _ in range(GREEDY_TOKENS):
            logits = ref(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
    return tuple(ids[len(prompt):]), margin


def clear_prompt(model: torch.nn.Module) -> tuple[list[int], tuple[int, ...]]:
    for prompt in CANDIDATES:
        tokens, margin = trainer_greedy(model, prompt)
        if margin >= 0.02:
            return prompt, tokens
    raise AssertionError("no candidate prompt has a clear greedy path")


async def engine_greedy(client: VLLMClient, prompt: list[int]) -> tuple[int, ...]:
    reply = await client.completions(prompt, max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True)
    return reply.choices[0].token_ids


def window_of(client: VLLMClient) -> WeightUpdateWindow:
    engine = EngineEndpoint(cell="test-cell-0", endpoint=client.endpoint, gpu_count=0, gpu_offset=0, generation=1)
    lock = LockStatus(holder="test", since="2026-01-01T00:00:00Z", expires="2026-01-01T01:00:00Z")
    return WeightUpdateWindow(engines=[engine], snapshot={"test-cell-0": 1}, lock=lock)


def transport(tmp: Path, *, check: bool) -> DistributedTransport:
    def engines(endpoint: str) -> VLLMClient:  # the transport closes the clients it opens
        return VLLMClient(endpoint, timeout=TIMEOUT_S)

    ctx = TransportContext(engines=engines, pause_mode=PauseMode.wait, sync_dir=tmp, source_model_dir=tmp,
                           bucket_bytes=64 * 1024, transfer_timeout_seconds=30.0, check_weights=check)
    return DistributedTransport(ctx, "gloo")


async def test_gloo_update_serves_the_trainers_greedy_tokens_and_equals_a_disk_reload(
    vllm: VLLMClient, tiny_model_dir: Path, tmp_path: Path
) -> None:
    for step in range(2):  # two updates in a row: a fresh group per window
        model = trainer_model(tiny_model_dir, seed=10 + step)
        prompt, expected = await asyncio.to_thread(clear_prompt, model)
        window = window_of(vllm)
        await transport(tmp_path, check=True).push(window, 5 + step, model)
        assert window.pushed == ["test-cell-0"]
        assert await vllm.get_weight_version() == str(5 + step)
        assert await vllm.is_paused() is False
        assert await engine_greedy(vllm, prompt) == expected  # the engine serves the trainer's policy
        # every tensor arrived intact: what the controller compares at end_update_weights
        assert window.expected_checksums == await vllm.received_checksums()
        assert window.expected_checksums == expected_checksums(named_tensors(model, torch.bfloat16))
        broadcast_sums = await vllm.weight_checksums()
        # the same weights through the disk path leave the engine bit-identical
        path = await asyncio.to_thread(DiskWeightWriter(tmp_path / "sync", tiny_model_dir).save, model, step)
        await vllm.reload_weights(str(path))
        assert await vllm.weight_checksums() == broadcast_sums


async def test_a_group_that_never_forms_fails_in_bounded_time_and_the_engine_keeps_its_weights(
    vllm: VLLMClient, tiny_model_dir: Path
) -> None:
    before = await vllm.weight_checksums()
    model = trainer_model(tiny_model_dir, seed=3)
    absent = VLLMReceiver(vllm)  # a second member that never joins: the world has one rank too many

    class NeverJoins(VLLMReceiver):
        async def join(self, group: GroupAddress, rank_offset: int) -> None:
            await asyncio.Event().wait()

    started = time.monotonic()
    with pytest.raises(WeightTransferFailed) as err:
        await WeightBroadcaster("gloo", timeout_s=TRANSFER_TIMEOUT_S).update(
            [absent, NeverJoins(vllm)], named_tensors(model, torch.bfloat16), "9")
    took = time.monotonic() - started
    assert err.value.step == "form group" and took < TRANSFER_TIMEOUT_S + 5.0 + 10.0, took
    assert await vllm.is_paused() is False  # weights untouched: resumed
    assert await vllm.weight_checksums() == before
    # the next window forms a new group and succeeds
    report = await WeightBroadcaster("gloo", timeout_s=30.0).update(
        [VLLMReceiver(vllm)], named_tensors(model, torch.bfloat16), "10")
    assert report.tensors > 0 and await vllm.get_weight_version() == "10"


class KilledWhenTheBroadcastStarts(VLLMReceiver):
    """A real second engine, SIGKILLed (its whole process group) once the group has formed and
    the trainer starts sending: what a node loss or an OOM kill does mid-broadcast."""

    def __init__(self, client: VLLMClient, server: VLLMServer) -> None:
        super().__init__(client)
        self.server = server

    async def receive(self, buckets: Sequence[Bucket], version: str | None, timeout_s: float,
                      bucket_sent: Callable[[int], Awaitable[None]], digest: bool = False) -> None:
        assert self.server.process is not None
        os.killpg(self.server.process.pid, signal.SIGKILL)
        await super().receive(buckets, version, timeout_s, bucket_sent, digest)


async def test_an_engine_that_dies_mid_broadcast_fails_the_update_in_bounded_time(
    vllm: VLLMClient, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two real engines in the group; the second is killed as the broadcast starts. The update
    fails within the transfer timeout, the survivor stays paused (it may hold part of the
    update), and the next window (the survivor alone, as after the dead cell left) succeeds."""
    model = trainer_model(tiny_model_dir, seed=4)
    tensors = named_tensors(model, torch.bfloat16)
    victim = await asyncio.to_thread(start_vllm_server, tiny_model_dir, log_path=tmp_path / "victim.log")
    victim_client = VLLMClient(victim.endpoint, timeout=TIMEOUT_S)
    try:
        started = time.monotonic()
        with pytest.raises(WeightTransferFailed) as err:
            await WeightBroadcaster("gloo", bucket_bytes=32 * 1024, timeout_s=TRANSFER_TIMEOUT_S).update(
                [VLLMReceiver(vllm), KilledWhenTheBroadcastStarts(victim_client, victim)], tensors, "11")
        took = time.monotonic() - started
    finally:
        await victim_client.close()
        await asyncio.to_thread(stop_vllm_server, victim)
    assert err.value.step == "broadcast" and took < TRANSFER_TIMEOUT_S + 35.0, took
    assert await vllm.is_paused() is True  # may hold half an update: it serves nothing until replaced
    report = await WeightBroadcaster("gloo", timeout_s=30.0).update([VLLMReceiver(vllm)], tensors, "12")
    assert report.tensors == len(tensors)
    assert await vllm.is_paused() is False
    prompt, expected = await asyncio.to_thread(clear_prompt, model)
    assert await engine_greedy(vllm, prompt) == expected


def _trainer_that_dies(endpoint: str, model_dir: str, after_buckets: int, done: Any,
                       loaded: Any = None, go: Any = None) -> None:
    """A trainer process: pause, form the group, start the engine's receive, send some buckets, die.

    With `loaded` and `go` (events) it reports its model loaded and waits for `go` before it
    touches the engine: a caller that opens an update window for it can open it then, so that
    the window's lock timeout is not spent on the process's start-up (a minute under load)."""
    import os

    async def run() -> None:
        client = VLLMClient(endpoint, timeout=TIMEOUT_S)
        receiver = VLLMReceiver(client)
        tensors = named_tensors(trainer_model(Path(model_dir), seed=6), torch.bfloat16)
        if loaded is not None:
            loaded.set()
            await asyncio.to_thread(go.wait, 300)
        from rljob_client.weights.broadcast import TrainerGroup, local_address_towards
        from rljob_client.weights.buckets import pack_bucket, plan_buckets

        buckets = plan_buckets(tensors.items(), 16 * 1024)
        await receiver.pause(PauseMode.wait)
        group = TrainerGroup("gloo", local_address_towards(endpoint), 2, "rljob-weights", TRANSFER_TIMEOUT_S)
        await asyncio.gather(asyncio.to_thread(group.form, True), receiver.join(group.address, 1))
        receiving = asyncio.ensure_future(receiver.receive(buckets, "13", TRANSFER_TIMEOUT_S, _never))
        # Give the receive call a moment to reach the engine. Not a wait for state: if the
        # engine enters receive_weights only after we are gone, its first broadcast fails at
        # once, which is the same fault seen from the engine.
        await asyncio.wait({receiving}, timeout=0.5)
        for bucket in buckets[:after_buckets]:
            await asyncio.to_thread(group.broadcast, pack_bucket(bucket, tensors))
        done.set()
        os._exit(1)  # the trainer dies mid-broadcast: no abort, no goodbye

    asyncio.run(run())


async def _never(_: int) -> None:
    return None


async def test_a_trainer_that_dies_mid_broadcast_leaves_the_engine_paused_and_ready_for_the_next(
    vllm: VLLMClient, tiny_model_dir: Path
) -> None:
    """The engine's receive ends within the transfer timeout once its trainer is gone; it stays
    paused (half an update: the window's lock expiry then aborts it and the controller replaces
    it), out of the dead group, and a new trainer's update succeeds."""
    ctx = multiprocessing.get_context("spawn")
    done = ctx.Event()
    proc = ctx.Process(target=_trainer_that_dies, args=(vllm.endpoint, str(tiny_model_dir), 2, done))
    started = time.monotonic()
    proc.start()
    await asyncio.to_thread(proc.join, 120)
    assert done.is_set() and proc.exitcode == 1

    async def receive_ended() -> bool:  # the engine answers control calls again
        try:
            return await asyncio.wait_for(vllm.is_paused(), 2.0)
        except (TimeoutError, Exception):
            return False

    deadline = time.monotonic() + TRANSFER_TIMEOUT_S + 30.0
    while not await receive_ended():
        assert time.monotonic() < deadline, "the engine is still stuck in the dead trainer's broadcast"
        await asyncio.sleep(0.2)
    assert time.monotonic() - started < 120 + TRANSFER_TIMEOUT_S + 30.0
    assert await vllm.is_paused() is True  # half an update is never served
    model = trainer_model(tiny_model_dir, seed=7)
    await WeightBroadcaster("gloo", timeout_s=30.0).update([VLLMReceiver(vllm)], named_tensors(model, torch.bfloat16), "14")
    prompt, expected = await asyncio.to_thread(clear_prompt, model)
    assert await vllm.is_paused() is False and await engine_greedy(vllm, prompt) == expected
