"""The training batch the executor hands to trainers, and its byte format.

One module for both sides (executor encodes, `RolloutStream` decodes) so they cannot drift.
A batch is a flat set of named numpy arrays with one row per sample plus a small JSON
header; the byte format is `b"RLJB" | u32 version | u64 header length | JSON header | arrays`,
each array 64-byte aligned, so the receiver maps them with `np.frombuffer` without a copy.

Arrays (N samples, L = longest prompt+response in the batch):
  tokens           int32   [N, L]  prompt then response token ids, right-padded with pad_id
  response_mask    uint8   [N, L]  1 where the token was generated (the loss mask)
  logprobs         float32 [N, L]  the engine's logprob of each generated token, 0 elsewhere
  prompt_lengths   int32   [N]
  response_lengths int32   [N]
  rewards          float32 [N]
  advantages       float32 [N]     group-normalised (GRPO): (r - mean_group) / (std_group + eps)
  weight_versions  int64   [N]     weight version each sample was generated under
  prompt_indices   int64   [N]     dataset row of the prompt
  group_indices    int32   [N]     GRPO group within the rollout (one group per prompt)
  sample_indices   int32   [N]     sample within its group
Optional, from a rollout function (absent otherwise; readers must not require them):
  token_weight_versions int64 [N, L] weight version of each response token, 0 elsewhere
  meta["sample_metadata"]            one JSON object per row, the rollout function's
  meta["failed_samples"]             samples whose reward or rollout function failed
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAGIC = b"RLJB"
FORMAT_VERSION = 1
_ALIGN = 64
_PREFIX = struct.Struct("<4sIQ")

ARRAY_FIELDS: dict[str, str] = {
    "tokens": "int32",
    "response_mask": "uint8",
    "logprobs": "float32",
    "prompt_lengths": "int32",
    "response_lengths": "int32",
    "rewards": "float32",
    "advantages": "float32",
    "weight_versions": "int64",
    "prompt_indices": "int64",
    "group_indices": "int32",
    "sample_indices": "int32",
}


@dataclass
class TrainBatch:
    """One rank's share of a rollout: whole GRPO groups, arrays in ARRAY_FIELDS."""

    arrays: dict[str, np.ndarray]
    rollout_id: int
    rank: int = 0
    world_size: int = 1
    n_samples_per_prompt: int = 1
    pad_id: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.arrays["rewards"].shape[0])

    def __getattr__(self, name: str) -> np.ndarray:
        arrays = self.__dict__.get("arrays")
        if arrays is not None and name in arrays:
            return arrays[name]
        raise AttributeError(name)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def select_groups(self, groups: np.ndarray | list[int], rank: int, world_size: int) -> TrainBatch:
        """The rows of the given group indices (in order), as a batch of its own."""
        groups = np.asarray(groups, dtype=np.int64)
        rows = np.flatnonzero(np.isin(self.arrays["group_indices"], groups))
        return TrainBatch(
            arrays={k: np.ascontiguousarray(v[rows]) for k, v in self.arrays.items()},
            rollout_id=self.rollout_id,
            rank=rank,
            world_size=world_size,
            n_samples_per_prompt=self.n_samples_per_prompt,
            pad_id=self.pad_id,
            meta=dict(self.meta),
        )

    def shard(self, rank: int, world_size: int) -> TrainBatch:
        """This rank's contiguous share of whole groups; shards are disjoint and cover the batch.

        Groups are split as evenly as possible (the first `n % world_size` ranks get one more).
        """
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of size {world_size}")
        if world_size == 1:  # the whole batch: share the arrays, copy nothing
            return TrainBatch(dict(self.arrays), self.rollout_id, 0, 1, self.n_samples_per_prompt, self.pad_id, dict(self.meta))
        groups = np.unique(self.arrays["group_indices"])
        mine = np.array_split(groups, world_size)[rank]
        return self.select_groups(mine, rank, world_size)


def _header(batch: TrainBatch) -> tuple[dict[str, Any], list[tuple[int, np.ndarray]]]:
    offset = 0
    entries: dict[str, Any] = {}
    layout: list[tuple[int, np.ndarray]] = []
    for name, arr in batch.arrays.items():
        arr = np.ascontiguousarray(arr)
        offset = -(-offset // _ALIGN) * _ALIGN
        entries[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset, "nbytes": arr.nbytes}
        layout.append((offset, arr))
        offset += arr.nbytes
    header = {
        "rollout_id": batch.rollout_id,
        "rank": batch.rank,
        "world_size": batch.world_size,
        "n_samples_per_prompt": batch.n_samples_per_prompt,
        "pad_id": batch.pad_id,
        "meta": batch.meta,
        "arrays": entries,
        "data_nbytes": offset,
    }
    return header, layout


def encode(batch: TrainBatch) -> list[memoryview]:
    """The batch as a list of buffers to write in order (no concatenation copy of the arrays)."""
    header, layout = _header(batch)
    head = json.dumps(header, separators=(",", ":")).encode()
    start = _PREFIX.size + len(head)
    pad = -start % _ALIGN
    head += b" " * pad
    parts: list[memoryview] = [memoryview(_PREFIX.pack(MAGIC, FORMAT_VERSION, len(head))), memoryview(head)]
    pos = 0
    for offset, arr in layout:
        if offset > pos:
            parts.append(memoryview(bytes(offset - pos)))
        parts.append(arr.data.cast("B"))
        pos = offset + arr.nbytes
    return parts


def encoded_size(parts: list[memoryview]) -> int:
    return sum(p.nbytes for p in parts)


def encode_bytes(batch: TrainBatch) -> bytes:
    return b"".join(encode(batch))


def decode(buf: bytes | bytearray | memoryview) -> TrainBatch:
    """Arrays are zero-copy views of `buf` (read-only when `buf` is bytes)."""
    mv = memoryview(buf)
    magic, version, head_len = _PREFIX.unpack_from(mv, 0)
    if magic != MAGIC:
        raise ValueError("not an RLJob train batch (bad magic)")
    if version != FORMAT_VERSION:
        raise ValueError(f"train batch format {version} is not supported (expected {FORMAT_VERSION})")
    start = _PREFIX.size + head_len
    header = json.loads(bytes(mv[_PREFIX.size : start]))
    if len(mv) - start < header["data_nbytes"]:
        raise ValueError(f"truncated train batch: {len(mv) - start} of {header['data_nbytes']} data bytes")
    arrays = {}
    for name, e in header["arrays"].items():
        dtype = np.dtype(e["dtype"])
        count = e["nbytes"] // dtype.itemsize
        arrays[name] = np.frombuffer(mv, dtype=dtype, count=count, offset=start + e["offset"]).reshape(e["shape"])
    return TrainBatch(
        arrays=arrays,
        rollout_id=header["rollout_id"],
        rank=header["rank"],
        world_size=header["world_size"],
        n_samples_per_prompt=header["n_samples_per_prompt"],
        pad_id=header["pad_id"],
        meta=header["meta"],
    )


@dataclass(frozen=True)
class ShardRef:
    """What the executor actor's `get` returns: a reference into the Ray object store, not bytes.

    `ref` is an ObjectRef of this rank's TrainBatch (numpy arrays pickled out-of-band, so a
    driver on a Ray node maps them without a copy).
    """

    rollout_id: int
    rank: int
    world_size: int
    ref: Any
    nbytes: int
    n_samples: int
