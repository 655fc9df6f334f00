"""Streaming a model's weights out of the trainer one tensor at a time, one bucket on disk at a time.

A sharded model (FSDP2, Megatron) is never whole on one rank: `iter_named_tensors` gathers one
parameter (`DTensor.full_tensor()`, a collective every rank runs) and hands it on, and
`write_stream` packs the tensors into safetensors shards of at most `bucket_bytes`, writing
each shard as soon as it fills. The result is a HuggingFace model directory (shards plus
`model.safetensors.index.json`, or one `model.safetensors` when one bucket held everything)
that vLLM and SGLang reload and `from_pretrained` reads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

# Files copied beside the weights so that the directory is a loadable model on its own.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
NamedTensors = Iterable[tuple[str, torch.Tensor]]


def iter_named_tensors(model: torch.nn.Module, dtype: torch.dtype | None = torch.bfloat16) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full CPU tensor) per parameter and buffer, a tensor shared by two names once.

    Every rank must drain it: a DTensor's `full_tensor()` is a collective.
    """
    seen: set[tuple[int, int]] = set()
    for name, tensor in model.state_dict().items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        key = (local.untyped_storage().data_ptr(), local.storage_offset())
        if key in seen and local.numel() > 0:
            continue
        seen.add(key)
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        t = full.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        yield name, t.contiguous().cpu()


def drain(tensors: NamedTensors) -> int:
    """Run the iterator to its end without keeping anything (the non-writer ranks' share of the collectives)."""
    n = 0
    for _ in tensors:
        n += 1
    return n


def write_stream(tensors: NamedTensors, final: Path, source_model_dir: Path | None, bucket_bytes: int) -> Path:
    """Write `tensors` as a model directory at `final` (atomically, via a temporary sibling); returns `final`.

    At most one bucket of tensors is held at a time. Config and tokenizer files are copied from
    `source_model_dir` so that the directory loads on its own.
    """
    if bucket_bytes < 1:
        raise ValueError("bucket_bytes must be at least 1")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        tmp.chmod(0o755)  # engines may run as another user on shared storage
        weight_map: dict[str, str] = {}
        bucket: dict[str, torch.Tensor] = {}
        size, shards, total = 0, 0, 0

        def flush() -> None:
            nonlocal bucket, size, shards
            if not bucket:
                return
            shards += 1
            shard = f"model-{shards:05d}.safetensors"
            save_file(bucket, str(tmp / shard), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(bucket, shard))
            bucket, size = {}, 0

        for name, tensor in tensors:
            if name in weight_map or name in bucket:
                raise ValueError(f"tensor {name!r} was published twice in one version")
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > bucket_bytes:
                flush()
            bucket[name] = tensor.detach().contiguous().cpu()
            size += nbytes
            total += nbytes
        flush()
        if not weight_map:
            raise ValueError("no tensor was published (the iterator was empty)")
        if shards == 1:  # one bucket: the plain single-file layout
            os.replace(tmp / "model-00001.safetensors", tmp / SINGLE_FILE)
        else:
            (tmp / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
        if source_model_dir is not None:
            for name in MODEL_FILES:
                src = source_model_dir / name
                if src.is_file():
                    shutil.copy2(src, tmp / name)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
