"""The bucket format of a process-group weight update, shared by the trainer and the engine side.

A broadcast moves one flat uint8 tensor per bucket, so the receiver must learn beforehand what
is inside: the trainer sends the plan (per bucket, each tensor's name, dtype, shape and byte
offset) in the RPC that starts the receive, then broadcasts the buckets in order. Offsets are
aligned to `ALIGN` bytes so that every slice can be viewed as its dtype without a copy.

This module imports only torch and the standard library: the engine side
(`rljob_client.engine.vllm_worker_extension`) runs it inside the vLLM worker process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

ALIGN = 64
DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024
# A tensor at least this large is sent from its own memory (a bucket of its own) rather than
# copied into a packed one: packing is a second copy of the model on the trainer's CPU, which
# competes with the link and the engines' loads.
# Below it, one collective per tensor costs more than the copy saves.
DEFAULT_DIRECT_BYTES = 1024 * 1024

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {name!r}") from None


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def to_wire(self) -> list[object]:
        return [self.name, self.dtype, list(self.shape), self.offset, self.nbytes]

    @classmethod
    def from_wire(cls, raw: Sequence[object]) -> TensorSlot:
        name, dtype, shape, offset, nbytes = raw
        assert isinstance(shape, list)
        return cls(str(name), str(dtype), tuple(int(s) for s in shape), int(str(offset)), int(str(nbytes)))


@dataclass(frozen=True)
class Bucket:
    slots: tuple[TensorSlot, ...]
    nbytes: int

    def to_wire(self) -> dict[str, object]:
        return {"nbytes": self.nbytes, "tensors": [s.to_wire() for s in self.slots]}

    @classmethod
    def from_wire(cls, raw: Mapping[str, object]) -> Bucket:
        tensors = raw["tensors"]
        assert isinstance(tensors, list)
        return cls(tuple(TensorSlot.from_wire(t) for t in tensors), int(str(raw["nbytes"])))


def plan_buckets(tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 direct_bytes: int | None = DEFAULT_DIRECT_BYTES) -> list[Bucket]:
    """Tensors in order, packed greedily into buckets of at most `bucket_bytes`; a tensor larger
    than that, or of at least `direct_bytes` (None: never), gets a bucket of its own, which
    `pack_bucket` sends without a copy. Fewer, larger collectives are what reach the link's
    bandwidth; the direct ones are large enough already."""
    if bucket_bytes < 1:
        raise ValueError("bucket_bytes must be positive")
    if direct_bytes is not None and direct_bytes < 1:
        raise ValueError("direct_bytes must be positive (or None)")
    buckets: list[Bucket] = []
    slots: list[TensorSlot] = []
    used = 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        alone = nbytes > bucket_bytes or (direct_bytes is not None and nbytes >= direct_bytes)
        if slots and (alone or _aligned(used) + nbytes > bucket_bytes):
            buckets.append(Bucket(tuple(slots), used))
            slots, used = [], 0
        slot = TensorSlot(name, dtype_name(t.dtype), tuple(t.shape), _aligned(used), nbytes)
        if alone:
            buckets.append(Bucket((slot,), nbytes))
            continue
        slots.append(slot)
        used = slot.offset + nbytes
    if slots:
        buckets.append(Bucket(tuple(slots), used))
    return buckets


def _as_bytes(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t`'s bytes, flat, on `device`: a view of its own memory when it is already there and contiguous."""
    return t.detach().to(device).contiguous().reshape(-1).view(torch.uint8)


def pack_bucket(bucket: Bucket, tensors: Mapping[str, torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
    """One flat uint8 buffer holding the bucket's tensors at their offsets; a bucket of one
    tensor is that tensor's own memory (no copy), so the caller must not change it while it is sent."""
    if len(bucket.slots) == 1 and bucket.slots[0].offset == 0:
        return _as_bytes(tensors[bucket.slots[0].name], device)
    buf = torch.zeros(bucket.nbytes, dtype=torch.uint8, device=device)
    for slot in bucket.slots:
        buf[slot.offset:slot.offset + slot.nbytes].copy_(_as_bytes(tensors[slot.name], device))
    return buf


def unpack_bucket(bucket: Bucket, buf: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into `buf`, in the plan's order (no copy)."""
    out: list[tuple[str, torch.Tensor]] = []
    for slot in bucket.slots:
        raw = buf[slot.offset:slot.offset + slot.nbytes]
        out.append((slot.name, raw.view(dtype_of(slot.dtype)).reshape(slot.shape)))
    return out


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of the tensor's bytes: the digest vLLM's /weight_checker reports per parameter."""
    return hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data).hexdigest()
