"""The process group of one window, shared by the trainer's sender and the engine's receiver.

The trainer's rank 0 hosts a TCPStore and forms a torch process group outside any torch world
(`TrainerGroup`); the engine-side extension joins it with the same primitives. The receiver and
sender protocols live here so that the broadcaster and vLLM's native NCCL path both build on
them without importing each other.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.distributed import TCPStore

from controller_runtime.api.spec import PauseMode
from rljob_client.weights.buckets import Bucket


def new_process_group(
    backend: str, store: Any, rank: int, world_size: int, timeout_s: float
) -> Any:
    """A ProcessGroupGloo/ProcessGroupNCCL over `store`, outside torch's default world."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        opts = torch.distributed.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return torch.distributed.ProcessGroupNCCL(store, rank, world_size, opts)
    raise ValueError(f"unknown weight-transfer backend {backend!r} (gloo or nccl)")


def broadcast_from(group: Any, tensor: torch.Tensor, root: int = 0, timeout_s: float | None = None) -> None:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = root
    work = group.broadcast([tensor], opts)
    if timeout_s is None:
        work.wait()
    else:
        work.wait(datetime.timedelta(seconds=timeout_s))


def connect_store(address: str, port: int, world_size: int, is_master: bool, timeout_s: float) -> Any:
    return TCPStore(address, port, world_size, is_master, timeout=datetime.timedelta(seconds=timeout_s),
                    wait_for_workers=False)



@dataclass(frozen=True)
class GroupAddress:
    master_address: str
    master_port: int
    world_size: int
    backend: str
    group_name: str
    timeout_s: float


class WeightReceiver(Protocol):
    """The engine-side calls of one participant (what differs between vLLM and SGLang)."""

    endpoint: str
    framing: str  # "packed": one flat buffer per bucket; "per_tensor": one broadcast per tensor
    group_kind: str  # "torch": a torch process group on a TCPStore; "vllm-pynccl": vLLM's own

    async def join(self, group: GroupAddress, rank_offset: int) -> None: ...
    async def receive(self, buckets: Sequence[Bucket], version: str | None, timeout_s: float,
                      bucket_sent: Callable[[int], Awaitable[None]], digest: bool = False) -> None: ...
    async def leave(self) -> None: ...
    async def pause(self, mode: PauseMode) -> None: ...
    async def resume(self) -> None: ...
    async def set_weight_version(self, version: str) -> None: ...


class EngineControl:
    """Pause, resume and the weight version: the same calls on every engine client."""

    group_kind = "torch"

    def __init__(self, client: Any) -> None:
        self.client = client
        self.endpoint: str = client.endpoint

    async def pause(self, mode: PauseMode) -> None:
        await self.client.pause(mode)

    async def resume(self) -> None:
        await self.client.resume()

    async def set_weight_version(self, version: str) -> None:
        await self.client.set_weight_version(version)



class TrainerGroup:
    """The trainer's rank 0: the TCPStore master and its process group for one window."""

    def __init__(self, backend: str, address: str, world_size: int, group_name: str, timeout_s: float) -> None:
        self.backend = backend
        self.world_size = world_size
        self.group_name = group_name
        self.timeout_s = timeout_s
        self.store = connect_store(address, 0, world_size, True, timeout_s)
        self.address = GroupAddress(address, int(self.store.port), world_size, backend, group_name, timeout_s)
        self.group: Any = None
        self.device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")

    def form(self, handshake: bool) -> None:
        """Blocks until every rank joined (or the timeout): run it beside the engines' joins.

        With `handshake`, a one-byte broadcast (the vLLM extension sends the same) proves every
        rank is connected before any weight moves; NCCL would otherwise connect lazily.
        """
        from torch.distributed import PrefixStore

        self.group = new_process_group(self.backend, PrefixStore(self.group_name, self.store), 0,
                                       self.world_size, self.timeout_s)
        if handshake:
            broadcast_from(self.group, torch.zeros(1, dtype=torch.uint8, device=self.device), 0, self.timeout_s)

    def broadcast(self, tensor: torch.Tensor) -> None:
        broadcast_from(self.group, tensor, 0, self.timeout_s)

    def close(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            shutdown = getattr(group, "shutdown", None)
            if callable(shutdown):
                with contextlib.suppress(Exception):
                    shutdown()
        self.store = None


class SenderGroup(Protocol):
    """The trainer's rank 0 of a window's group (TrainerGroup, or vllm_native_nccl's)."""

    address: GroupAddress
    device: torch.device

    def form(self, handshake: bool) -> None: ...
    def broadcast(self, tensor: torch.Tensor) -> None: ...
    def close(self) -> None: ...


