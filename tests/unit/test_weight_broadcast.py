"""The process-group weight update without an engine: buckets, and the broadcaster's steps and
failures against in-process receivers that run the worker extension's own code over gloo."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import torch
from rljob_client.weights.broadcast import (
    GroupAddress,
    WeightBroadcaster,
    WeightTransferFailed,
    expected_checksums,
)
from rljob_client.weights.buckets import (
    ALIGN,
    Bucket,
    pack_bucket,
    plan_buckets,
    tensor_digest,
    unpack_bucket,
)
from rljob_client.weights.group import broadcast_from, connect_store, new_process_group

from controller_runtime.api.spec import PauseMode


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(50, 8, generator=g).to(torch.bfloat16),
        "layer.0.q_proj.weight": torch.randn(8, 8, generator=g),
        "layer.0.norm.weight": torch.randn(7, generator=g).to(torch.float16),
        "step": torch.tensor([3], dtype=torch.int64),
    }


def test_buckets_hold_at_most_their_size_and_round_trip_every_dtype() -> None:
    tensors = sample_tensors()
    buckets = plan_buckets(tensors.items(), bucket_bytes=600)
    assert [s.name for b in buckets for s in b.slots] == list(tensors)
    assert all(b.nbytes <= 800 or len(b.slots) == 1 for b in buckets)  # embed (800 B) alone
    assert all(s.offset % ALIGN == 0 for b in buckets for s in b.slots)
    for bucket in buckets:
        wire = Bucket.from_wire(bucket.to_wire())
        assert wire == bucket
        for name, t in unpack_bucket(wire, pack_bucket(bucket, tensors)):
            assert t.dtype == tensors[name].dtype and torch.equal(t, tensors[name])


def test_one_bucket_when_everything_fits() -> None:
    assert len(plan_buckets(sample_tensors().items(), bucket_bytes=1 << 20)) == 1


class ThreadReceiver:
    """An engine of one worker: the extension's group calls, run in a thread like vLLM's worker."""

    framing = "packed"
    group_kind = "torch"

    def __init__(self, name: str, *, join_fails: bool = False, dies_after_buckets: int | None = None) -> None:
        self.endpoint = f"http://{name}"
        self.join_fails = join_fails
        self.dies_after_buckets = dies_after_buckets
        self.calls: list[str] = []
        self.received: dict[str, torch.Tensor] = {}
        self.group: Any = None
        self.version: str | None = None

    async def join(self, group: GroupAddress, rank_offset: int) -> None:
        self.calls.append("join")
        if self.join_fails:
            raise ConnectionError("this engine cannot reach the trainer")

        def run() -> None:
            from torch.distributed import PrefixStore

            store = connect_store(group.master_address, group.master_port, group.world_size, False, group.timeout_s)
            self.group = new_process_group(group.backend, PrefixStore(group.group_name, store), rank_offset,
                                           group.world_size, group.timeout_s)
            broadcast_from(self.group, torch.zeros(1, dtype=torch.uint8), 0, group.timeout_s)

        await asyncio.to_thread(run)

    async def receive(self, buckets: Sequence[Bucket], version: str | None, timeout_s: float,
                      bucket_sent: Callable[[int], Awaitable[None]], digest: bool = False) -> None:
        self.calls.append("receive")

        def run() -> None:
            for i, bucket in enumerate(buckets):
                if self.dies_after_buckets is not None and i >= self.dies_after_buckets:
                    self.group.shutdown()  # the engine's process is gone: its sockets close
                    raise ConnectionError("engine died")
                buf = torch.empty(bucket.nbytes, dtype=torch.uint8)
                broadcast_from(self.group, buf, 0, timeout_s)
                self.received.update((n, t.clone()) for n, t in unpack_bucket(bucket, buf))

        await asyncio.to_thread(run)

    async def leave(self) -> None:
        self.calls.append("leave")

    async def pause(self, mode: PauseMode) -> None:
        self.calls.append("pause")

    async def resume(self) -> None:
        self.calls.append("resume")

    async def set_weight_version(self, version: str) -> None:
        self.calls.append(f"version {version}")


async def test_every_engine_receives_every_tensor_then_serves_the_version() -> None:
    tensors = sample_tensors()
    engines = [ThreadReceiver("e0"), ThreadReceiver("e1")]
    report = await WeightBroadcaster("gloo", bucket_bytes=600, timeout_s=20, master_address="127.0.0.1").update(
        engines, tensors, "7")
    assert report.tensors == len(tensors) and report.buckets >= 2
    for e in engines:
        assert e.calls == ["pause", "join", "receive", "version 7", "resume", "leave"]
        assert {n: tensor_digest(t) for n, t in e.received.items()} == expected_checksums(tensors)


async def test_a_group_that_never_forms_fails_within_the_timeout_and_resumes_the_engines() -> None:
    engines = [ThreadReceiver("e0"), ThreadReceiver("e1", join_fails=True)]
    started = time.monotonic()
    with pytest.raises(WeightTransferFailed) as err:
        await WeightBroadcaster("gloo", timeout_s=2, master_address="127.0.0.1").update(engines, sample_tensors(), "1")
    assert err.value.step == "form group"
    assert time.monotonic() - started < 2 + 5 + 5  # the timeout, the join's margin, slack
    assert engines[1].calls == ["pause", "join", "resume"]  # weights untouched: back to serving


async def test_an_engine_that_dies_mid_broadcast_fails_the_update_and_nobody_is_resumed() -> None:
    engines = [ThreadReceiver("e0"), ThreadReceiver("e1", dies_after_buckets=1)]
    with pytest.raises(WeightTransferFailed) as err:
        await WeightBroadcaster("gloo", bucket_bytes=600, timeout_s=2, master_address="127.0.0.1").update(
            engines, sample_tensors(), "1")
    assert err.value.step == "broadcast"
    assert all("resume" not in e.calls for e in engines)  # they may hold half of the new weights


async def test_no_engine_is_a_failure_not_an_empty_success() -> None:
    with pytest.raises(WeightTransferFailed):
        await WeightBroadcaster("gloo").update([], sample_tensors(), "1")


def test_only_gloo_and_nccl_are_backends() -> None:
    with pytest.raises(ValueError):
        WeightBroadcaster("mpi")


def test_a_tensor_of_at_least_direct_bytes_is_sent_from_its_own_memory_the_rest_packed() -> None:
    tensors = {
        "small.a": torch.arange(10, dtype=torch.float32),
        "big": torch.randn(64, 64),  # 16 KiB
        "small.b": torch.arange(5, dtype=torch.int64),
    }
    buckets = plan_buckets(tensors.items(), bucket_bytes=1 << 20, direct_bytes=16 * 1024)
    assert [[s.name for s in b.slots] for b in buckets] == [["small.a"], ["big"], ["small.b"]]
    sent = pack_bucket(buckets[1], tensors)
    assert sent.data_ptr() == tensors["big"].data_ptr()  # no copy on the trainer
    for bucket in buckets:
        for name, t in unpack_bucket(bucket, pack_bucket(bucket, tensors)):
            assert torch.equal(t, tensors[name])
    packed = plan_buckets(tensors.items(), bucket_bytes=1 << 20, direct_bytes=None)
    assert len(packed) == 1 and pack_bucket(packed[0], tensors).data_ptr() != tensors["big"].data_ptr()


def test_a_non_contiguous_direct_tensor_is_copied_not_sent_as_its_strided_memory() -> None:
    t = torch.randn(64, 64).t()  # a view whose memory is not in row-major order
    (bucket,) = plan_buckets([("t", t)], bucket_bytes=1 << 20, direct_bytes=1)
    ((_, got),) = unpack_bucket(bucket, pack_bucket(bucket, {"t": t}))
    assert torch.equal(got, t)
