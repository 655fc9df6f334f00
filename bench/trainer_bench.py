"""The SDK's streaming weight export against a plain `torch.save` of the same state dict.

    bench/trainer_bench.py --megabytes 256 --bucket-mb 32 --repeats 3

Writes a model of `--megabytes` of bf16 tensors (layers of 4 MiB, like a small LLM's matrices)
with `write_stream(iter_named_tensors(model))` (the `publish_weights` disk path) and with
`torch.save(state_dict)`; both to the same directory, the page cache dropped by fsync. Prints
JSON and a one-line summary: bytes/s of each, their ratio (target >= 0.8) and the export's
peak extra memory over the model itself (target <= one bucket), from the largest tensor set
alive during the export (tracked by wrapping the iterator).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from rljob_client.weights.export import iter_named_tensors, write_stream

LAYER_BYTES = 4 * 2**20


def model_of(megabytes: int) -> torch.nn.Module:
    layers = max(1, megabytes * 2**20 // LAYER_BYTES)
    side = int((LAYER_BYTES // 2) ** 0.5)  # bf16
    return torch.nn.Sequential(*(torch.nn.Linear(side, side, bias=False, dtype=torch.bfloat16) for _ in range(layers)))


def fsync_dir(path: Path) -> None:
    for f in path.rglob("*") if path.is_dir() else [path]:
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


class Tracked:
    """The bytes the export holds beyond the model: tensors handed out and not yet written (a bucket)."""

    def __init__(self, it: Iterator[tuple[str, torch.Tensor]], bucket: int) -> None:
        self.it, self.bucket, self.pending, self.peak = it, bucket, 0, 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in self.it:
            nbytes = t.numel() * t.element_size()
            if self.pending and self.pending + nbytes > self.bucket:
                self.pending = 0  # write_stream flushed the bucket before taking this one
            self.pending += nbytes
            self.peak = max(self.peak, self.pending)
            yield name, t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megabytes", type=int, default=256)
    p.add_argument("--bucket-mb", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    a = p.parse_args()
    model = model_of(a.megabytes)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    root = Path(a.dir or tempfile.mkdtemp(prefix="trainer-bench-"))
    stream_s, save_s, peaks = [], [], []
    try:
        for i in range(a.repeats):
            out = root / f"v{i}"
            started = time.perf_counter()
            tracked = Tracked(iter_named_tensors(model, None), a.bucket_mb * 2**20)
            write_stream(tracked, out, None, a.bucket_mb * 2**20)
            fsync_dir(out)
            stream_s.append(time.perf_counter() - started)
            peaks.append(tracked.peak)
            shutil.rmtree(out)
            started = time.perf_counter()
            target = root / f"save{i}.pt"
            torch.save(model.state_dict(), target)
            fsync_dir(target)
            save_s.append(time.perf_counter() - started)
            target.unlink()
    finally:
        if a.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    stream_bps, save_bps = nbytes / min(stream_s), nbytes / min(save_s)
    result = {"bytes": nbytes, "bucket_bytes": a.bucket_mb * 2**20, "stream_seconds": stream_s, "save_seconds": save_s,
              "stream_bytes_per_s": stream_bps, "save_bytes_per_s": save_bps, "ratio": stream_bps / save_bps,
              "peak_extra_bytes": max(peaks)}
    print(json.dumps(result))
    print(f"export {nbytes / 2**20:.0f} MiB: stream {stream_bps / 2**20:.0f} MiB/s, torch.save {save_bps / 2**20:.0f} MiB/s, "
          f"ratio {result['ratio']:.2f} (target >= 0.8); peak extra {max(peaks) / 2**20:.1f} MiB "
          f"(bucket {a.bucket_mb} MiB)")


if __name__ == "__main__":
    main()
