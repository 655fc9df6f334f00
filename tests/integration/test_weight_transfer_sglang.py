"""The trainer's process-group update drives SGLang's routes (route level: the SGLang stand-in of
test_sglang_client.py). The stand-in answers the routes but holds no process group, so each
engine's rank is played by a thread beside it that joins the trainer's group and receives the
per-tensor broadcasts, as SGLang's `update_weights_from_distributed` does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest_asyncio
import torch
from aiohttp import web
from rljob_client.weights.broadcast import GroupAddress, SGLangReceiver, WeightBroadcaster, receiver_for
from rljob_client.weights.buckets import Bucket, dtype_of
from rljob_client.weights.group import broadcast_from, connect_store, new_process_group

from controller_runtime.clients import SGLangClient
from tests.integration.test_sglang_client import FakeSGLangState, sglang_app


class SGLangWithARank(SGLangReceiver):
    """The real SGLang receiver (routes), plus a thread playing the server's rank in the group."""

    def __init__(self, client: SGLangClient) -> None:
        super().__init__(client)
        self.rank_group: Any = None
        self.received: dict[str, torch.Tensor] = {}

    async def join(self, group: GroupAddress, rank_offset: int) -> None:
        def rank() -> None:
            from torch.distributed import PrefixStore

            store = connect_store(group.master_address, group.master_port, group.world_size, False, group.timeout_s)
            self.rank_group = new_process_group(group.backend, PrefixStore(group.group_name, store), rank_offset,
                                                group.world_size, group.timeout_s)

        await asyncio.gather(super().join(group, rank_offset), asyncio.to_thread(rank))

    async def receive(self, buckets: Sequence[Bucket], version: str | None, timeout_s: float,
                      bucket_sent: Callable[[int], Awaitable[None]], digest: bool = False) -> None:
        async def sent(i: int) -> None:
            def rank() -> None:
                for slot in buckets[i].slots:
                    t = torch.empty(slot.shape, dtype=dtype_of(slot.dtype))
                    broadcast_from(self.rank_group, t, 0, timeout_s)
                    self.received[slot.name] = t

            await asyncio.gather(bucket_sent(i), asyncio.to_thread(rank))

        await super().receive(buckets, version, timeout_s, sent, digest)


@pytest_asyncio.fixture(loop_scope="function")
async def two_sglang() -> AsyncIterator[list[tuple[SGLangClient, FakeSGLangState]]]:
    out, runners = [], []
    for _ in range(2):
        state = FakeSGLangState()
        runner = web.AppRunner(sglang_app(state))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        out.append((SGLangClient(f"http://127.0.0.1:{port}", timeout=10.0), state))
        runners.append(runner)
    try:
        yield out
    finally:
        for client, _ in out:
            await client.close()
        for runner in runners:
            await runner.cleanup()


async def test_the_broadcaster_drives_sglangs_group_and_bucket_routes(
    two_sglang: list[tuple[SGLangClient, FakeSGLangState]],
) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {f"layer.{i}.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16) for i in range(5)}
    assert isinstance(receiver_for(two_sglang[0][0]), SGLangReceiver)
    receivers = [SGLangWithARank(client) for client, _ in two_sglang]
    report = await WeightBroadcaster("gloo", bucket_bytes=600, timeout_s=20, master_address="127.0.0.1").update(
        receivers, tensors, "step-3")
    assert report.buckets == 3  # 256 B tensors, two to a 600 B bucket
    for offset, ((_, state), receiver) in enumerate(zip(two_sglang, receivers, strict=True), start=1):
        group = state.groups["rljob-weights"]
        assert (group["rank_offset"], group["world_size"], group["backend"]) == (offset, 3, "gloo")
        calls = state.distributed_updates
        assert [n for c in calls for n in c["names"]] == list(tensors)
        assert all(c["dtypes"] == ["bfloat16"] * len(c["names"]) and c["group_name"] == "rljob-weights" for c in calls)
        assert [c.get("weight_version") for c in calls] == [None, None, "step-3"]  # the version comes with the last
        assert state.weight_version == "step-3" and state.paused_mode is None  # paused, then resumed
        assert all(torch.equal(receiver.received[n], t) for n, t in tensors.items())
