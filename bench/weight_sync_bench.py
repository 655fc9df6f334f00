"""Weight sync into vLLM CPU engines: disk reload vs the gloo broadcast, against raw gloo.

    .venv/bin/python bench/weight_sync_bench.py [--updates 5] [--models tiny 0.5b] [--cells 1 2]
        [--bucket-mb 512] [--direct-mb 1] [--json-out FILE]
    .venv/bin/python bench/weight_sync_bench.py --smoke      # seconds, no vLLM: CI

For each model (the tiny test model, and a random Llama of about 0.5 B parameters built with
the project's tiny-model builder at a larger shape) and each fleet size (1 and 2 real vLLM CPU
engine cells), one update is timed `--updates` times (median reported), each way as the
reference trainer does it inside a window:

- disk: write the model directory (DiskWeightWriter.save) and reload it in every engine at
  once (pause -> collective_rpc reload_weights -> set version -> resume); write and reload
  are also reported apart;
- gloo: WeightBroadcaster.update (pause -> form a fresh group -> bucketed broadcast into the
  worker extension, which streams it into vLLM's in-place reload -> version -> resume ->
  leave), the trainer's tensors already in memory as bf16;
- raw: a gloo broadcast of the same buckets from this process to as many plain receiver
  processes on loopback, nothing else: the bandwidth this machine's gloo can reach, measured in
  the same run. The ratio raw seconds / gloo seconds is the share of it the update achieves
  (target >= 0.6) and gloo must beat disk on the 0.5 B model.

Each vLLM CPU cell of the 0.5 B model takes about 4.5 GiB: a model/fleet combination runs only
when `free` shows the memory for it (the result says what was left out and why). Every engine
is checked after each update (the version it reports), so a no-op cannot pass for a fast one.

Each gloo row also carries `gloo_breakdown` (medians): the trainer's steps (pause, form_group,
broadcast, set_version, resume, leave) and threads (pack, waiting for a packed bucket, send),
and the first engine's receive (time inside the broadcasts, waiting for a bucket, hashing,
and the rest: vLLM's load_weights and re-processing). With RLJOB_WEIGHT_PROFILE_DIR set, every
engine also writes a cProfile of each receive's loading thread there (the function breakdown
of bench/RESULTS.md). `--direct-mb`: tensors of at least this size leave the trainer from their
own memory (0: pack everything, the old behaviour). Each round also times two variants of the
gloo update, interleaved with it so the machine's load hits them alike: `packed` (every tensor
copied into buckets, as before) and `spread` (the engine's transfer threads moved off the core
vLLM pins its compute to); their medians are under `variants`.

--smoke: the tiny model's tensors broadcast by WeightBroadcaster into in-process receivers
(threads that run the extension's receive loop) vs raw gloo, in a few seconds.

Prints one JSON object, then a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the vLLM launcher lives with the test fixtures

from rljob_client.tinymodel import TinyModelConfig, build_tiny_model  # noqa: E402
from rljob_client.weights.broadcast import GroupAddress, VLLMReceiver, WeightBroadcaster  # noqa: E402
from rljob_client.weights.buckets import (  # noqa: E402
    DEFAULT_BUCKET_BYTES,
    DEFAULT_DIRECT_BYTES,
    Bucket,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
)
from rljob_client.weights.disk import DiskWeightWriter, unique_state_dict  # noqa: E402
from rljob_client.weights.group import broadcast_from, connect_store, new_process_group  # noqa: E402

from controller_runtime.api.spec import PauseMode  # noqa: E402
from controller_runtime.clients import VLLMClient  # noqa: E402
from tests.fixtures.vllm_server import CACHE_DIR, start_vllm_server, stop_vllm_server, tiny_model_path  # noqa: E402

GIB = 2**30
TARGET_RAW_RATIO = 0.6
# About 0.47 B parameters (0.94 GB in bf16): 24 layers of 1024 wide, a 32 k vocabulary.
HALF_B = TinyModelConfig(vocab_size=32000, hidden_size=1024, num_attention_heads=16, num_key_value_heads=16,
                         head_dim=64, num_hidden_layers=24, intermediate_size=4096, max_position_embeddings=512)
NEED_PER_CELL = {"tiny": 3.5 * GIB, "0.5b": 4.5 * GIB}
NEED_TRAINER = {"tiny": 0.5 * GIB, "0.5b": 4.0 * GIB}


def model_dir(name: str) -> Path:
    if name == "tiny":
        return tiny_model_path(0)
    return build_tiny_model(CACHE_DIR / "bench-llama-0.5b-seed0", seed=0, config=HALF_B)


def trainer_tensors(path: Path, seed: int) -> dict[str, torch.Tensor]:
    """The trainer's weights as it sends them (bf16), perturbed per update so every update is new."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    tensors = unique_state_dict(model, torch.bfloat16)
    g = torch.Generator().manual_seed(seed)
    first = next(iter(tensors))
    tensors[first] = tensors[first] + 0.01 * torch.randn(tensors[first].shape, generator=g).to(torch.bfloat16)
    return tensors


# -- raw gloo on loopback ---------------------------------------------------------------------


def _raw_receiver(port: int, rank: int, world: int, sizes: list[int], rounds: int) -> None:
    from torch.distributed import PrefixStore

    store = connect_store("127.0.0.1", port, world, False, 120.0)
    group = new_process_group("gloo", PrefixStore("raw", store), rank, world, 120.0)
    broadcast_from(group, torch.zeros(1, dtype=torch.uint8), 0, 120.0)
    bufs = [torch.empty(n, dtype=torch.uint8) for n in sizes]
    for _ in range(rounds):
        for buf in bufs:
            broadcast_from(group, buf, 0, 120.0)


def raw_gloo_seconds(buckets: Sequence[Bucket], tensors: dict[str, torch.Tensor], receivers: int,
                     rounds: int) -> list[float]:
    """Seconds to broadcast the packed buckets to `receivers` processes, per round (packing excluded)."""
    from torch.distributed import PrefixStore

    packed = [pack_bucket(b, tensors) for b in buckets]
    world = 1 + receivers
    store = connect_store("127.0.0.1", 0, world, True, 120.0)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_raw_receiver, args=(store.port, r, world, [b.nbytes for b in buckets], rounds))
             for r in range(1, world)]
    for p in procs:
        p.start()
    try:
        group = new_process_group("gloo", PrefixStore("raw", store), 0, world, 120.0)
        broadcast_from(group, torch.zeros(1, dtype=torch.uint8), 0, 120.0)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for buf in packed:
                broadcast_from(group, buf, 0, 120.0)
            times.append(time.perf_counter() - t0)
    finally:
        for p in procs:
            p.join(60)
    return times


# -- one fleet ----------------------------------------------------------------------------------


async def disk_update(clients: Sequence[VLLMClient], writer: DiskWeightWriter, model: torch.nn.Module,
                      version: int) -> dict[str, float]:
    t0 = time.perf_counter()
    path = await asyncio.to_thread(writer.save, model, version)
    t1 = time.perf_counter()

    async def one(c: VLLMClient) -> None:
        await c.pause(PauseMode.wait)
        try:
            await c.update_weights_from_disk(str(path), str(version))
        finally:
            await c.resume()

    await asyncio.gather(*(one(c) for c in clients))
    t2 = time.perf_counter()
    return {"seconds": t2 - t0, "write_seconds": t1 - t0, "reload_seconds": t2 - t1}


async def check_versions(clients: Sequence[VLLMClient], version: int) -> None:
    got = [await c.get_weight_version() for c in clients]
    if got != [str(version)] * len(clients):
        raise RuntimeError(f"engines report {got}, expected version {version}")


def breakdown(gloo: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per part of a gloo update: the trainer's steps and threads, and the first
    engine's receive (time in the broadcasts, waiting for a bucket, loading, hashing)."""
    parts: dict[str, list[float]] = {}
    for run in gloo:
        engine = run["engines"][0][0] if run.get("engines") and run["engines"][0] else {}
        for key, value in [*run.items(), *((f"engine_{k}", v) for k, v in engine.items())]:
            if key.endswith("seconds") and isinstance(value, int | float):
                parts.setdefault(key, []).append(float(value))
    return {k: round(statistics.median(v), 4) for k, v in parts.items()}


async def bench_fleet(name: str, cells: int, updates: int, bucket_bytes: int, workdir: Path,
                      direct_bytes: int | None = DEFAULT_DIRECT_BYTES) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    path = model_dir(name)
    servers = []
    try:
        for i in range(cells):
            servers.append(await asyncio.to_thread(start_vllm_server, path, log_path=workdir / f"{name}-{cells}-{i}.log",
                                                   startup_timeout_s=900))
        clients = [VLLMClient(s.endpoint, timeout=900.0) for s in servers]
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
        tensors = unique_state_dict(model, torch.bfloat16)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        # raw: the same bytes in the fewest, largest collectives (packed buckets, no direct ones)
        buckets = plan_buckets(tensors.items(), bucket_bytes, None)
        writer = DiskWeightWriter(workdir / f"sync-{name}-{cells}", path, keep=1)
        broadcaster = WeightBroadcaster("gloo", bucket_bytes=bucket_bytes, direct_bytes=direct_bytes, timeout_s=600.0)
        # the same update with one thing changed, interleaved so the machine's load hits all alike:
        # `packed` copies every tensor into buckets (as before direct sends); `spread` moves the
        # engine's transfer threads off the core vLLM pins its compute to
        packed = WeightBroadcaster("gloo", bucket_bytes=bucket_bytes, direct_bytes=None, timeout_s=600.0)
        disk: list[dict[str, float]] = []
        gloo: list[dict[str, Any]] = []
        variants: dict[str, list[dict[str, Any]]] = {"packed": [], "spread": []}
        version = 0

        async def timed(b: WeightBroadcaster) -> dict[str, Any]:
            nonlocal version
            version += 1
            receivers = [VLLMReceiver(c) for c in clients]
            t0 = time.perf_counter()
            report = await b.update(receivers, tensors, str(version))
            run = {"seconds": time.perf_counter() - t0, **{f"{k}_seconds": v for k, v in report.seconds.items()},
                   "engines": [r.last_receive for r in receivers]}
            await check_versions(clients, version)
            return run

        for _ in range(updates):
            version += 1
            disk.append(await disk_update(clients, writer, model, version))
            await check_versions(clients, version)
            gloo.append(await timed(broadcaster))
            variants["packed"].append(await timed(packed))
            await asyncio.gather(*(c.collective_rpc("set_weight_transfer_cpus", kwargs={"spread": True}) for c in clients))
            variants["spread"].append(await timed(broadcaster))
            await asyncio.gather(*(c.collective_rpc("set_weight_transfer_cpus", kwargs={"spread": False}) for c in clients))
        raw = await asyncio.to_thread(raw_gloo_seconds, buckets, tensors, cells, updates)
        for c in clients:
            await c.reload_weights(str(path))
            await c.close()
    finally:
        for s in servers:
            await asyncio.to_thread(stop_vllm_server, s)
    med = statistics.median
    disk_s, gloo_s, raw_s = med(d["seconds"] for d in disk), med(g["seconds"] for g in gloo), med(raw)
    return {
        "model": name, "cells": cells, "bytes": nbytes, "tensors": len(tensors), "raw_buckets": len(buckets),
        "gloo_buckets": len(plan_buckets(tensors.items(), bucket_bytes, direct_bytes)),
        "direct_bytes": direct_bytes, "bucket_bytes": bucket_bytes,
        "params": sum(t.numel() for t in tensors.values()), "updates": updates,
        "disk_seconds": disk_s, "disk_write_seconds": med(d["write_seconds"] for d in disk),
        "disk_reload_seconds": med(d["reload_seconds"] for d in disk),
        "gloo_seconds": gloo_s, "gloo_broadcast_seconds": med(g.get("broadcast_seconds", 0.0) for g in gloo),
        "raw_gloo_seconds": raw_s,
        "disk_gbps": nbytes / disk_s / 1e9, "gloo_gbps": nbytes / gloo_s / 1e9, "raw_gloo_gbps": nbytes / raw_s / 1e9,
        "gloo_vs_raw": raw_s / gloo_s, "gloo_speedup_vs_disk": disk_s / gloo_s, "gloo_breakdown": breakdown(gloo),
        "variants": {name: {"gloo_seconds": med(r["seconds"] for r in runs), "breakdown": breakdown(runs),
                            "runs": [r["seconds"] for r in runs]}
                     for name, runs in variants.items()},
        "disk_runs": disk, "gloo_runs": gloo, "raw_runs": raw,
    }


# -- smoke: in-process receivers, no vLLM --------------------------------------------------------


class ThreadReceiver:
    """Runs the extension's receive loop (without a model) in a thread of this process."""

    framing = "packed"
    group_kind = "torch"

    def __init__(self, index: int) -> None:
        self.endpoint = f"thread://{index}"
        self.group: Any = None
        self.received = 0

    async def join(self, group: GroupAddress, rank_offset: int) -> None:
        def run() -> None:
            from torch.distributed import PrefixStore

            store = connect_store(group.master_address, group.master_port, group.world_size, False, group.timeout_s)
            self.group = new_process_group("gloo", PrefixStore(group.group_name, store), rank_offset,
                                           group.world_size, group.timeout_s)
            broadcast_from(self.group, torch.zeros(1, dtype=torch.uint8), 0, group.timeout_s)

        await asyncio.to_thread(run)

    async def receive(self, buckets: Sequence[Bucket], version: str | None, timeout_s: float,
                      bucket_sent: Callable[[int], Awaitable[None]], digest: bool = False) -> None:
        def run() -> None:
            for bucket in buckets:
                buf = torch.empty(bucket.nbytes, dtype=torch.uint8)
                broadcast_from(self.group, buf, 0, timeout_s)
                self.received += len(unpack_bucket(bucket, buf))

        await asyncio.to_thread(run)

    async def leave(self) -> None:
        self.group = None

    async def pause(self, mode: PauseMode) -> None:
        return None

    async def resume(self) -> None:
        return None

    async def set_weight_version(self, version: str) -> None:
        return None


async def smoke(updates: int) -> dict[str, Any]:
    tensors = trainer_tensors(tiny_model_path(0), seed=0)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    buckets = plan_buckets(tensors.items(), 64 * 1024)
    broadcaster = WeightBroadcaster("gloo", bucket_bytes=64 * 1024, timeout_s=30.0, master_address="127.0.0.1")
    times = []
    for i in range(updates):
        receivers = [ThreadReceiver(0)]
        t0 = time.perf_counter()
        await broadcaster.update(receivers, tensors, str(i))
        times.append(time.perf_counter() - t0)
        if receivers[0].received != len(tensors):
            raise RuntimeError(f"received {receivers[0].received} of {len(tensors)} tensors")
    raw = await asyncio.to_thread(raw_gloo_seconds, buckets, tensors, 1, updates)
    g, r = statistics.median(times), statistics.median(raw)
    return {"model": "tiny", "cells": 1, "receivers": "in-process threads", "bytes": nbytes, "buckets": len(buckets),
            "updates": updates, "gloo_seconds": g, "raw_gloo_seconds": r, "gloo_vs_raw": r / g}


# -- main ---------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "commit": commit.strip(), "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / GIB, 1), "platform": platform.platform(),
            "torch": torch.__version__}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["tiny", "0.5b"], choices=["tiny", "0.5b"])
    parser.add_argument("--cells", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--bucket-mb", type=int, default=DEFAULT_BUCKET_BYTES // 2**20)
    parser.add_argument("--direct-mb", type=float, default=DEFAULT_DIRECT_BYTES / 2**20,
                        help="tensors of at least this size are sent from their own memory; 0: pack everything")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {"bench": "weight_sync", "machine": machine()}
    if args.smoke:
        result["smoke"] = asyncio.run(smoke(max(3, min(args.updates, 5))))
        s = result["smoke"]
        summary = (f"weight_sync smoke: tiny model {s['bytes'] / 1e6:.2f} MB, broadcaster {s['gloo_seconds'] * 1e3:.1f} ms "
                   f"vs raw gloo {s['raw_gloo_seconds'] * 1e3:.1f} ms (ratio {s['gloo_vs_raw']:.2f})")
    else:
        rows, skipped = [], []
        with tempfile.TemporaryDirectory(prefix="weight-sync-bench.") as tmp:
            for name in args.models:
                for cells in args.cells:
                    need = cells * NEED_PER_CELL[name] + NEED_TRAINER[name]
                    available = psutil.virtual_memory().available
                    if available < need:
                        skipped.append({"model": name, "cells": cells, "reason": f"needs {need / GIB:.1f} GiB, "
                                        f"{available / GIB:.1f} GiB available"})
                        continue
                    direct = int(args.direct_mb * 2**20) or None
                    rows.append(asyncio.run(bench_fleet(name, cells, args.updates, args.bucket_mb * 2**20, Path(tmp),
                                                        direct)))
        result["rows"], result["skipped"] = rows, skipped
        half = [r for r in rows if r["model"] == "0.5b"]
        result["targets"] = {
            "gloo_vs_raw_at_least": TARGET_RAW_RATIO,
            "gloo_vs_raw_met": all(r["gloo_vs_raw"] >= TARGET_RAW_RATIO for r in half) if half else None,
            "gloo_faster_than_disk_on_0.5b": all(r["gloo_seconds"] < r["disk_seconds"] for r in half) if half else None,
        }
        summary = "weight_sync: " + "; ".join(
            f"{r['model']} x{r['cells']}: disk {r['disk_seconds']:.2f} s, gloo {r['gloo_seconds']:.2f} s "
            f"({r['gloo_gbps']:.2f} GB/s, {r['gloo_vs_raw']:.0%} of raw {r['raw_gloo_gbps']:.2f} GB/s; "
            f"packed {r['variants']['packed']['gloo_seconds']:.2f} s, spread {r['variants']['spread']['gloo_seconds']:.2f} s)"
            for r in rows
        ) + (f"; skipped {len(skipped)}" if skipped else "")
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
