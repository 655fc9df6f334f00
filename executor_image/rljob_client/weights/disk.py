"""Weights for `disk` synchronisation: a complete HuggingFace model directory per version.

vLLM's `reload_weights(weights_path=DIR)` (collective_rpc) points the engine's model config
at DIR and reads every `*.safetensors` there with its default loader; SGLang's
`update_weights_from_disk` wants a whole model directory. So each version is written as a
full model dir (`model.safetensors`, or shards of `weightUpdate.bucketMegabytes` for a large model,
streamed by `weights.export`) plus the config and tokenizer files copied from the
served model, written into a temporary sibling and renamed into place so that an engine
never reads half a file. Only the newest `keep` versions stay on disk (the engine reads a
version inside the update window, before the next one is written).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

from rljob_client.weights.export import iter_named_tensors, write_stream

VERSION_DIR = re.compile(r"^v(\d+)$")


def unique_state_dict(model: torch.nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name, cast to `dtype`; a tensor shared by two names is kept once.

    safetensors refuses shared storage; HF checkpoints of tied models keep the first name
    (the embedding) and the loaders re-tie the rest.
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        t = tensor.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.contiguous().cpu()
        # a snapshot: copy only what the cast (or the move) did not copy already; a second copy
        # of the model here is time inside the update window
        out[name] = t.clone() if t.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr() else t
    return out


class DiskWeightWriter:
    """Writes `ROOT/v<N>/` model directories and prunes old ones."""

    def __init__(self, root: str | os.PathLike[str], source_model_dir: str | os.PathLike[str], keep: int = 2,
                 dtype: torch.dtype | None = torch.bfloat16, bucket_bytes: int = 512 * 2**20) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.root = Path(root)
        self.source = Path(source_model_dir)
        self.keep = keep
        self.dtype = dtype
        self.bucket_bytes = bucket_bytes

    def path_for(self, version: int) -> Path:
        return self.root / f"v{version}"

    def versions(self) -> list[int]:
        """Complete versions on disk, oldest first."""
        if not self.root.is_dir():
            return []
        found = [int(m.group(1)) for p in self.root.iterdir() if (m := VERSION_DIR.match(p.name)) and p.is_dir()]
        return sorted(found)

    def save(self, model: torch.nn.Module, version: int) -> Path:
        """Write version `version` and return its directory (absolute): streamed one bucket at a time."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = write_stream(iter_named_tensors(model, self.dtype), self.path_for(version).resolve(), self.source,
                             self.bucket_bytes)
        self.prune(version)
        return final

    def prune(self, current: int) -> list[Path]:
        """Keep `current` and the `keep - 1` versions just below it; delete the rest and stale temporaries.

        Versions above `current` are leftovers of an earlier run (or of a step that never
        completed before a restart) and go too: they must never be mistaken for newer weights.
        """
        removed: list[Path] = []
        older = [v for v in self.versions() if v < current]
        keep = {current, *older[max(0, len(older) - (self.keep - 1)):]}
        for v in self.versions():
            if v in keep:
                continue
            p = self.path_for(v)
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
        for p in self.root.glob(".v*"):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        return removed
