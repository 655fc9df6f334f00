"""`method: nccl` into vLLM's own NCCL weight-transfer engine (GPU engines only).

vLLM 0.32 ships one (`vllm/distributed/weight_transfer/nccl_engine.py`), switched on by the
engine's `--weight-transfer-config {"backend":"nccl"}` (the manifest builder passes it for
`nccl`) and driven over HTTP: `/init_weight_transfer_engine` (every worker joins the
trainer's group) -> `/start_weight_update` -> `/update_weights` (the workers receive the named
tensors, one broadcast each, in order, and hand them to the model's `load_weights`) ->
`/finish_weight_update` (the layerwise reload's re-processing, and the version) ->
`/shutdown_weight_transfer_engine`. Using it on GPUs means the engine's receive is vLLM's
maintained code, not ours; the rljob worker extension stays the CPU (`gloo`) path.

Why it fits the broadcaster unchanged: its unpacked mode is the "per_tensor" framing SGLang
already uses (the receiver posts one bucket's names, the trainer broadcasts that bucket's
tensors). What differs is the group: vLLM's `StatelessProcessGroup` + `PyNcclCommunicator`,
not a torch process group, so the trainer opens rank 0 with vLLM's own `trainer_init`
(`NativeNCCLGroup`; the trainer needs the vllm package for this path, imported only here).

vLLM's engine keeps no per-tensor digests, and a trainer image without vllm cannot open its
group: then (`weightUpdate.checkWeights`, or no vllm package) the extension's receive is used
with CUDA buffers (`use_native`).

Not run on a GPU in this project yet; the payloads are checked against vLLM's own dataclasses
(tests/unit/test_vllm_native_nccl.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import torch

from controller_runtime.clients.vllm import VLLMClient
from rljob_client.weights.buckets import Bucket
from rljob_client.weights.group import EngineControl, GroupAddress

GROUP_KIND = "vllm-pynccl"


def use_native(check_weights: bool, vllm_installed: bool | None = None) -> bool:
    """Whether `method: nccl` goes to vLLM's engine: only where the trainer can open its group
    (vllm installed) and the window needs no per-tensor checksums."""
    installed = importlib.util.find_spec("vllm") is not None if vllm_installed is None else vllm_installed
    return installed and not check_weights


def init_payload(master_address: str, master_port: int, rank_offset: int, world_size: int) -> dict[str, Any]:
    """`init_info` of /init_weight_transfer_engine (vLLM's NCCLWeightTransferInitInfo), unpacked
    mode: the trainer sends one broadcast per tensor, so both sides agree on no buffer geometry."""
    return {"master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "packed": False}


def update_payload(bucket: Bucket) -> dict[str, Any]:
    """`update_info` of /update_weights (vLLM's NCCLWeightTransferUpdateInfo) for one bucket."""
    return {"names": [s.name for s in bucket.slots], "dtype_names": [s.dtype for s in bucket.slots],
            "shapes": [list(s.shape) for s in bucket.slots]}


class VLLMNativeReceiver(EngineControl):
    """One vLLM engine of the window, received by vLLM's NCCL weight-transfer engine."""

    framing = "per_tensor"
    group_kind = GROUP_KIND
    client: VLLMClient

    async def join(self, group: GroupAddress, rank_offset: int) -> None:
        info = init_payload(group.master_address, group.master_port, rank_offset, group.world_size)
        await self.client.init_weight_transfer_engine(info, timeout_s=group.timeout_s + 30.0)

    async def receive(self, buckets: Sequence[Bucket], version: str | None, timeout_s: float,
                      bucket_sent: Callable[[int], Awaitable[None]], digest: bool = False) -> None:
        if digest:
            raise ValueError("vLLM's NCCL engine keeps no checksums; verified windows use the rljob extension")
        await self.client.start_weight_update()
        for i, bucket in enumerate(buckets):
            await asyncio.gather(self.client.update_weights(update_payload(bucket), timeout_s=timeout_s + 30.0),
                                 bucket_sent(i))
        await self.client.finish_weight_update(version)

    async def leave(self) -> None:
        await self.client.shutdown_weight_transfer_engine()


def free_port(address: str) -> int:
    """A port to host vLLM's rendezvous store on (its StatelessProcessGroup needs it up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class NativeNCCLGroup:
    """The trainer's rank 0 of vLLM's group: same surface as group.TrainerGroup."""

    def __init__(self, backend: str, address: str, world_size: int, group_name: str, timeout_s: float) -> None:
        if backend != "nccl":
            raise ValueError(f"vLLM's weight-transfer engine is NCCL only, not {backend!r}")
        self.address = GroupAddress(address, free_port(address), world_size, backend, group_name, timeout_s)
        self.device = torch.device("cuda")
        self.comm: Any = None

    def form(self, handshake: bool) -> None:
        """Blocks until every worker joined (their /init_weight_transfer_engine runs beside it)."""
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        a = self.address
        self.comm = trainer_init({"master_address": a.master_address, "master_port": a.master_port,
                                  "world_size": a.world_size})

    def broadcast(self, tensor: torch.Tensor) -> None:
        stream = torch.cuda.current_stream()
        self.comm.broadcast(tensor, src=0, stream=stream)
        stream.synchronize()  # the caller may free or reuse the tensor once this returns

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None:
            comm.destroy()
