"""Trainer side of a process-group weight update: one group per window, bucketed broadcast.

Inside an update window the writer rank (the trainer's rank 0) is rank 0 of a new group whose
other ranks are every worker of every participant of the window, in the window's order (the
controller sorts them by cell index; an engine of TP x PP workers takes that many ranks).
The group lives on a TCPStore the trainer hosts, not in any torch world, and is torn down at
the end of the window, so a cell recreated since the snapshot (it is not in the window) is
never in it and the next window forms a fresh one with whoever participates then.

One update: pause every engine -> form the group (each engine's `join` and the trainer's own
rank, concurrently) -> broadcast the buckets while the engines receive and load them -> set
the weight version -> resume -> leave the group. Every step is bounded by the transfer
timeout, and `WeightTransferFailed` (an EngineError) names the engines and the step, so the
caller aborts the window and the controller recreates the participants. A failure before any
weight moved resumes the engines; one during the broadcast leaves them paused, because they
may hold half of the new weights and must not serve them until they are recreated.

The same code runs `gloo` (CPU engines, tests) and `nccl` (GPU engines: buffers on the
trainer's CUDA device). Engine kinds differ only in the receiver: vLLM receives a plan of
packed buckets in one call (`rljob_client.engine.vllm_worker_extension`); SGLang's
`update_weights_from_distributed` takes one bucket's names/dtypes/shapes per call and one
broadcast per tensor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import torch

from controller_runtime.api.spec import PauseMode
from controller_runtime.clients.sglang import SGLangClient
from controller_runtime.clients.vllm import VLLMClient
from controller_runtime.errors import EngineError
from rljob_client.errors import RLJobError
from rljob_client.weights.buckets import (
    DEFAULT_BUCKET_BYTES,
    DEFAULT_DIRECT_BYTES,
    Bucket,
    dtype_name,
    pack_bucket,
    plan_buckets,
    tensor_digest,
)
from rljob_client.weights.disk import unique_state_dict
from rljob_client.weights.group import (
    EngineControl,
    GroupAddress,
    SenderGroup,
    TrainerGroup,
    WeightReceiver,
)
from rljob_client.weights.native_nccl import GROUP_KIND, NativeNCCLGroup, VLLMNativeReceiver

log = logging.getLogger(__name__)

MASTER_ADDR_ENV = "RLJOB_WEIGHT_MASTER_ADDR"
DEFAULT_GROUP_NAME = "rljob-weights"


class WeightTransferFailed(RLJobError, EngineError):
    """A process-group update failed; `step` says where, `engines` which endpoints were involved.

    An EngineError, so the training loop aborts the window and retries in a new one.
    """

    def __init__(self, step: str, engines: Sequence[str], cause: BaseException | str) -> None:
        self.step = step
        self.engines = list(engines)
        detail = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(", ".join(self.engines) or "(no engine)", f"weight transfer failed at {step}: {detail}")


@dataclass(frozen=True)
class TransferTarget:
    """One participant of the window: its endpoint and how many ranks (workers) it brings."""

    endpoint: str
    workers: int = 1
    cell: str = ""


class VLLMReceiver(EngineControl):
    """vLLM with the rljob worker extension: the whole plan in one `receive_weights` call."""

    framing = "packed"
    client: VLLMClient

    def __init__(self, client: VLLMClient) -> None:
        super().__init__(client)
        self.last_receive: list[Any] = []  # the workers' summaries of the last receive (their timings)

    async def join(self, group: GroupAddress, rank_offset: int) -> None:
        await self.client.init_weight_transfer(group.master_address, group.master_port, rank_offset,
                                               group.world_size, backend=group.backend,
                                               group_name=group.group_name, transfer_timeout_s=group.timeout_s)

    async def receive(self, buckets: Sequence[Bucket], version: str | None, timeout_s: float,
                      bucket_sent: Callable[[int], Awaitable[None]], digest: bool = False) -> None:
        plan = json.dumps([b.to_wire() for b in buckets], separators=(",", ":"))
        self.last_receive = await self.client.receive_weights(plan, transfer_timeout_s=timeout_s, digest=digest,
                                                              timeout_s=timeout_s + 30.0)

    async def leave(self) -> None:
        await self.client.close_weight_transfer()


class SGLangReceiver(EngineControl):
    """SGLang's native routes: one `update_weights_from_distributed` call per bucket.

    Driven at the route level only (tests/integration/test_sglang_client.py's stand-in); the
    rendezvous against a real SGLang server is untested here.
    """

    framing = "per_tensor"
    client: SGLangClient

    def __init__(self, client: SGLangClient) -> None:
        super().__init__(client)
        self._group_name = DEFAULT_GROUP_NAME

    async def join(self, group: GroupAddress, rank_offset: int) -> None:
        self._group_name = group.group_name
        await self.client.init_weights_update_group(group.master_address, group.master_port, rank_offset,
                                                    group.world_size, group_name=group.group_name,
                                                    backend=group.backend, timeout_s=group.timeout_s + 30.0)

    async def receive(self, buckets: Sequence[Bucket], version: str | None, timeout_s: float,
                      bucket_sent: Callable[[int], Awaitable[None]], digest: bool = False) -> None:
        for i, bucket in enumerate(buckets):
            call = self.client.update_weights_from_distributed(
                [s.name for s in bucket.slots], [s.dtype for s in bucket.slots], [list(s.shape) for s in bucket.slots],
                group_name=self._group_name, weight_version=version if i == len(buckets) - 1 else None,
                timeout_s=timeout_s + 30.0)
            await asyncio.gather(call, bucket_sent(i))

    async def leave(self) -> None:
        """SGLang keeps its group until the server restarts; nothing to call."""


def receiver_for(client: Any, *, native_nccl: bool = False) -> WeightReceiver:
    """The receiver of `client`'s engine kind; `native_nccl`: vLLM's own NCCL engine (GPU
    engines, windows that verify no checksums) instead of the rljob extension."""
    if isinstance(client, VLLMClient):
        if native_nccl:
            return VLLMNativeReceiver(client)
        return VLLMReceiver(client)
    if isinstance(client, SGLangClient):
        return SGLangReceiver(client)
    raise TypeError(f"no process-group receiver for {type(client).__name__}")


def local_address_towards(endpoint: str) -> str:
    """This machine's address on the route to `endpoint` (what the engine can reach us at);
    RLJOB_WEIGHT_MASTER_ADDR overrides it (e.g. a pod IP when routes are unusual)."""
    override = os.environ.get(MASTER_ADDR_ENV)
    if override:
        return override
    host = urlsplit(endpoint).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))  # UDP connect sends nothing; it only picks the route
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


@dataclass
class TransferReport:
    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


def sender_group_class(receivers: Sequence[WeightReceiver]) -> Callable[..., SenderGroup]:
    """The trainer's side of the group the receivers join (one kind per window)."""
    kinds = {r.group_kind for r in receivers}
    if len(kinds) != 1:
        raise ValueError(f"engines of one window must join one kind of group, not {sorted(kinds)}")
    if kinds == {"torch"}:
        return TrainerGroup
    if kinds == {GROUP_KIND}:
        return NativeNCCLGroup
    raise ValueError(f"unknown group kind {kinds.pop()!r}")


async def _bounded(step: str, engines: Sequence[str], seconds: float, aws: Iterable[Awaitable[Any]]) -> list[Any]:
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        async with asyncio.timeout(seconds):
            return list(await asyncio.gather(*tasks))
    except BaseException as exc:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if isinstance(exc, TimeoutError):
            raise WeightTransferFailed(step, engines, f"no answer within {seconds:g} s") from exc
        if isinstance(exc, Exception):
            raise WeightTransferFailed(step, engines, exc) from exc
        raise


class WeightBroadcaster:
    """Pushes one set of weights to a window's participants over a fresh process group."""

    def __init__(
        self,
        backend: str = "gloo",
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        direct_bytes: int | None = DEFAULT_DIRECT_BYTES,
        timeout_s: float = 120.0,
        pause_mode: PauseMode = PauseMode.wait,
        group_name: str = DEFAULT_GROUP_NAME,
        master_address: str | None = None,
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, not {backend!r}")
        self.backend = backend
        self.bucket_bytes = bucket_bytes
        self.direct_bytes = direct_bytes
        self.timeout_s = timeout_s
        self.pause_mode = pause_mode
        self.group_name = group_name
        self.master_address = master_address

    async def update(
        self,
        receivers: Sequence[WeightReceiver],
        tensors: Mapping[str, torch.Tensor],
        version: str | None,
        workers: Sequence[int] | None = None,
        *,
        digest: bool = False,
    ) -> TransferReport:
        """Pause -> group -> broadcast -> version -> resume -> leave; raises WeightTransferFailed.

        `workers`: ranks per receiver (TP x PP), default one each. `digest`: engines keep the
        sha256 of every tensor they received (for the controller's check, `expected_checksums`).
        A failure before the broadcast resumes the engines (their weights are untouched); one
        during or after it leaves them paused, since they may hold part of the new weights.
        """
        if not receivers:
            raise WeightTransferFailed("plan", [], "no engine in the window")
        endpoints = [r.endpoint for r in receivers]
        ranks = list(workers) if workers is not None else [1] * len(receivers)
        report = TransferReport()
        t0 = time.monotonic()
        buckets = plan_buckets(tensors.items(), self.bucket_bytes, self.direct_bytes)
        report.buckets = len(buckets)
        report.tensors = sum(len(b.slots) for b in buckets)
        report.bytes = sum(b.nbytes for b in buckets)
        group: SenderGroup | None = None
        try:
            try:
                await _bounded("pause", endpoints, self.timeout_s, (r.pause(self.pause_mode) for r in receivers))
                report.seconds["pause"] = time.monotonic() - t0
                address = self.master_address or local_address_towards(endpoints[0])
                group = formed = await asyncio.to_thread(sender_group_class(receivers), self.backend, address,
                                                         1 + sum(ranks), self.group_name, self.timeout_s)
                t1 = time.monotonic()
                offsets = [1 + sum(ranks[:i]) for i in range(len(receivers))]
                handshake = all(r.framing == "packed" for r in receivers)
                await _bounded("form group", endpoints, self.timeout_s + 5.0,
                               [asyncio.to_thread(formed.form, handshake),
                                *(r.join(formed.address, off) for r, off in zip(receivers, offsets, strict=True))])
                report.seconds["form_group"] = time.monotonic() - t1
            except Exception as exc:
                await self._resume_untouched(receivers)
                if isinstance(exc, WeightTransferFailed):
                    raise
                raise WeightTransferFailed("form group", endpoints, exc) from exc
            t2 = time.monotonic()
            await self._broadcast(formed, receivers, buckets, tensors, version, digest, report)
            report.seconds["broadcast"] = time.monotonic() - t2
            t3 = time.monotonic()
            if version is not None:
                await _bounded("set weight version", endpoints, self.timeout_s,
                               (r.set_weight_version(version) for r in receivers))
            report.seconds["set_version"] = time.monotonic() - t3
            t4 = time.monotonic()
            await _bounded("resume", endpoints, self.timeout_s, (r.resume() for r in receivers))
            report.seconds["resume"] = time.monotonic() - t4
            t5 = time.monotonic()
            await _bounded("leave group", endpoints, self.timeout_s, (r.leave() for r in receivers))
            report.seconds["leave"] = time.monotonic() - t5
        finally:
            if group is not None:
                await asyncio.to_thread(group.close)
        report.seconds["total"] = time.monotonic() - t0
        log.info("weights %s: %d tensors, %.1f MB in %d buckets to %d engines in %.2f s", version, report.tensors,
                 report.bytes / 1e6, report.buckets, len(receivers), report.seconds["total"])
        return report

    async def _resume_untouched(self, receivers: Sequence[WeightReceiver]) -> None:
        """Best effort: engines whose weights did not change go back to serving their old ones."""
        results = await asyncio.gather(*(asyncio.wait_for(r.resume(), self.timeout_s) for r in receivers),
                                       return_exceptions=True)
        for r, res in zip(receivers, results, strict=True):
            if isinstance(res, BaseException):
                log.warning("weights: resuming %s after a failed group failed too: %s", r.endpoint, res)

    async def _broadcast(self, group: SenderGroup, receivers: Sequence[WeightReceiver], buckets: Sequence[Bucket],
                         tensors: Mapping[str, torch.Tensor], version: str | None, digest: bool,
                         report: TransferReport) -> None:
        endpoints = [r.endpoint for r in receivers]
        framing = {r.framing for r in receivers}
        if len(framing) != 1:
            raise WeightTransferFailed("plan", endpoints, "engines of one window must be of one kind")
        if framing == {"packed"}:
            async def never(_: int) -> None:
                return None

            def send_all() -> None:
                # pack bucket i+1 while bucket i is on the wire
                spent = {"pack": 0.0, "pack_wait": 0.0, "send": 0.0}

                def pack(bucket: Bucket) -> torch.Tensor:
                    started = time.perf_counter()
                    buf = pack_bucket(bucket, tensors, group.device)
                    spent["pack"] += time.perf_counter() - started
                    return buf

                with ThreadPoolExecutor(1, thread_name_prefix="rljob-pack") as pool:
                    nxt = pool.submit(pack, buckets[0]) if buckets else None
                    for i in range(len(buckets)):
                        assert nxt is not None
                        waited = time.perf_counter()
                        buf = nxt.result()
                        spent["pack_wait"] += time.perf_counter() - waited
                        nxt = pool.submit(pack, buckets[i + 1]) if i + 1 < len(buckets) else None
                        sent = time.perf_counter()
                        group.broadcast(buf)
                        spent["send"] += time.perf_counter() - sent
                report.seconds.update({f"{k}_threads": v for k, v in spent.items()})

            await _bounded("broadcast", endpoints, self.timeout_s + 30.0,
                           [asyncio.to_thread(send_all),
                            *(r.receive(buckets, version, self.timeout_s, never, digest) for r in receivers)])
            return
        # per_tensor (SGLang): every receiver posts bucket i, the trainer broadcasts its tensors
        sent: list[asyncio.Event] = [asyncio.Event() for _ in buckets]
        started: list[int] = [0 for _ in buckets]

        async def bucket_sent(i: int) -> None:
            started[i] += 1
            if started[i] == len(receivers):
                def send_bucket() -> None:
                    for slot in buckets[i].slots:
                        group.broadcast(tensors[slot.name].detach().contiguous().to(group.device))

                await asyncio.to_thread(send_bucket)
                sent[i].set()
            else:
                await sent[i].wait()

        await _bounded("broadcast", endpoints, self.timeout_s + 30.0 * len(buckets),
                       (r.receive(buckets, version, self.timeout_s, bucket_sent, digest) for r in receivers))


def expected_checksums(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """tensor -> sha256 of the bytes the trainer sends: what every engine must report it received."""
    return {name: tensor_digest(t) for name, t in tensors.items()}


def named_tensors(model: torch.nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """What the trainer sends: the disk path's unique state dict (same names, same dtype)."""
    return unique_state_dict(model, dtype)


__all__ = [
    "GroupAddress",
    "SGLangReceiver",
    "TrainerGroup",
    "TransferReport",
    "TransferTarget",
    "VLLMReceiver",
    "WeightBroadcaster",
    "WeightReceiver",
    "WeightTransferFailed",
    "dtype_name",
    "expected_checksums",
    "local_address_towards",
    "named_tensors",
    "receiver_for",
    "sender_group_class",
]
