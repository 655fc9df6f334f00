"""Batch streaming to a trainer: RolloutStream over Ray Client vs a direct Ray driver.

    .venv/bin/python bench/rollout_stream_bench.py [--sizes-mib 1 16] [--iters 30] [--json-out FILE]

One Ray head on loopback, one executor actor (the real ExecutorActor and data channel, with
a synthetic batch of the given size in place of generation, so engines are not measured).
Each trainer is its own process and fetches `iters` distinct rollouts (each shard put into the
object store by the actor, as in a real run), after 3 warm-up fetches; `rounds` interleaved
rounds per mode, medians reported (other jobs on the machine make single runs noisy):

  client_http  RolloutStream over Ray Client, shard bytes over the HTTP side channel (default)
  client_http_via_store  the same, with the actor's side channel as it was before this change: each
               shard put into the object store and read back from there before it is sent
  client_ray   RolloutStream over Ray Client, ray.get of the ObjectRef (proxied by the client server)
  direct       a driver on the head node: ray.get of the ObjectRef (object store, zero-copy)
  raw_tcp      the same encoded bytes over a bare loopback TCP socket from a server process of its
               own (no HTTP, actor nor object store): the ceiling of any socket path on this machine

MiB/s counts the shard's array bytes per second of wall time, "shard in hand" (decoded
TrainBatch). Prints one JSON object, then a one-line summary with client_http / direct.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

TRAINER = r"""
import json, sys, time
from rljob_client.rollout_stream import RolloutStream
job, address, transport, iters, base = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
s = RolloutStream(job, address, transport=transport).connect()
assert s.transport == transport, (s.transport, transport)
for i in range(3):
    s.get(base + i, 0, 1)
nbytes = 0
t0 = time.perf_counter()
for i in range(iters):
    b = s.get(base + 3 + i, 0, 1)
    nbytes += b.nbytes
dt = time.perf_counter() - t0
print(json.dumps({"transport": transport, "seconds": dt, "batches": iters, "bytes": nbytes,
                  "mib_per_s": nbytes / dt / 2**20, "batches_per_s": iters / dt}))
s.close()
"""


RAW_TRAINER = r"""
import json, socket, sys, time
from rljob_client.wire.trainbatch import decode
port, length, iters = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sock = socket.create_connection(("127.0.0.1", port))
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
def fetch():
    sock.sendall(b"x")
    buf = bytearray(length)
    view, got = memoryview(buf), 0
    while got < length:
        got += sock.recv_into(view[got:])
    return decode(buf)
for _ in range(3):
    fetch()
nbytes = 0
t0 = time.perf_counter()
for _ in range(iters):
    nbytes += fetch().nbytes
dt = time.perf_counter() - t0
print(json.dumps({"transport": "raw_tcp", "seconds": dt, "batches": iters, "bytes": nbytes,
                  "mib_per_s": nbytes / dt / 2**20, "batches_per_s": iters / dt}))
"""


RAW_SERVER = r"""
import socket, sys
sys.path.insert(0, sys.argv[1])
from bench.rollout_stream_bench import synthetic_batch
from rljob_client.wire.trainbatch import encode, encoded_size
parts = encode(synthetic_batch(float(sys.argv[2]), 0))
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(4)
print(srv.getsockname()[1], encoded_size(parts), flush=True)
while True:
    conn, _ = srv.accept()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        while conn.recv(1):
            for part in parts:
                conn.sendall(part)
"""


def serve_raw(mib: float) -> tuple[int, int, subprocess.Popen[str]]:
    """A plain TCP server process that sends the encoded batch per 1-byte request: the floor of any
    socket path (no HTTP, no actor, no object store), its socket set up as the side channel's is."""
    proc = subprocess.Popen([sys.executable, "-c", RAW_SERVER, str(ROOT), str(mib)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)  # fmt: skip
    assert proc.stdout is not None
    port, length = proc.stdout.readline().split()
    return int(port), int(length), proc


def synthetic_batch(mib: float, rollout_id: int) -> Any:
    """A TrainBatch of about `mib` MiB: 64 rows for 1 MiB, width grows with size."""
    import numpy as np
    from rljob_client.wire.trainbatch import TrainBatch

    rows = 64 if mib <= 4 else 256
    width = max(16, int(mib * 2**20 / rows / 9))  # tokens int32 + mask uint8 + logprobs float32
    rng = np.random.default_rng(rollout_id)
    arrays = {
        "tokens": rng.integers(0, 1000, size=(rows, width), dtype=np.int32),
        "response_mask": np.ones((rows, width), dtype=np.uint8),
        "logprobs": rng.standard_normal((rows, width), dtype=np.float32),
        "prompt_lengths": np.full(rows, 8, dtype=np.int32),
        "response_lengths": np.full(rows, width - 8, dtype=np.int32),
        "rewards": rng.random(rows, dtype=np.float32),
        "advantages": rng.standard_normal(rows, dtype=np.float32),
        "weight_versions": np.zeros(rows, dtype=np.int64),
        "prompt_indices": np.arange(rows, dtype=np.int64) // 8,
        "group_indices": (np.arange(rows) // 8).astype(np.int32),
        "sample_indices": (np.arange(rows) % 8).astype(np.int32),
    }
    return TrainBatch(arrays=arrays, rollout_id=rollout_id, n_samples_per_prompt=8)


def make_actor_class() -> Any:
    from rollout_executor.actor import ExecutorActor

    class SyntheticExecutor:
        """Stands in for RolloutExecutor: one prebuilt batch per size, relabelled per rollout."""

        def __init__(self, mib: float) -> None:
            self.template = synthetic_batch(mib, 0)
            self.versions = type("V", (), {"current": 0})()
            # what the actor calls on the executor's metrics: the side channel's /metrics and its count
            self.metrics = type("M", (), {"exposition": staticmethod(lambda: b""), "shard_served": staticmethod(lambda: None)})()

        async def start(self) -> None:
            return None

        async def close(self) -> None:
            return None

        async def get(self, rollout_id: int, rank: int, world_size: int) -> Any:
            b = self.template.shard(rank, world_size)
            b.rollout_id = rollout_id
            return b

        def stats(self) -> dict[str, Any]:
            return {}

    class BenchActor(ExecutorActor):
        def __init__(self, config: Any, mib: float) -> None:  # no engines, no dataset
            import asyncio
            import secrets

            self.config = config
            self._static = None
            self.executor = SyntheticExecutor(mib)  # type: ignore[assignment]
            self._token = secrets.token_urlsafe(32)
            self._channel = None
            self._shards = {}
            self._batches = {}
            self._started = asyncio.Lock()
            self._data_url = None

    class ViaStoreActor(BenchActor):
        """The side channel as it was before: every shard through the object store (put, then get)."""

        async def _shard_batch(self, rollout_id: int, rank: int, world_size: int) -> Any:
            ref = await self._shard_ref(rollout_id, rank, world_size)
            return await ref.ref

    return BenchActor, ViaStoreActor


def run(sizes: list[float], iters: int, rounds: int) -> dict[str, Any]:
    import ray
    from rollout_executor.config import ACTOR_NAMESPACE, ExecutorConfig, actor_name
    from rollout_executor.rayhead import start_ray_head

    head = start_ray_head(num_cpus=2, object_store_bytes=1024 * 2**20)
    results: dict[str, Any] = {"ray_version": ray.__version__, "iters": iters, "rounds": rounds, "sizes": {}}
    raw_servers: list[subprocess.Popen[str]] = []  # killed however the run ends (a failed mode left one behind)
    try:
        ray.init(address=head.address, namespace=ACTOR_NAMESPACE, logging_level="WARNING", log_to_driver=False)
        bench_cls, via_store_cls = (ray.remote(c) for c in make_actor_class())
        for mib in sizes:
            job = f"bench-{str(mib).replace('.', '-')}"
            actors = []
            for cls, name in ((bench_cls, job), (via_store_cls, job + "-store")):
                cfg = ExecutorConfig(job=name, dataset_path="/dev/null", model="none")
                actors.append(cls.options(name=actor_name(name), namespace=ACTOR_NAMESPACE, lifetime="detached",
                                          max_concurrency=100, num_cpus=0).remote(cfg, mib))  # fmt: skip
            ray.get([a.ready.remote() for a in actors])
            per: dict[str, Any] = {"shard_bytes": synthetic_batch(mib, 0).nbytes}
            raw_port, raw_len, raw_server = serve_raw(mib)
            raw_servers.append(raw_server)
            modes = [("direct", head.address, "ray"), ("client_http", head.client_address, "http"),
                     ("client_http_via_store", head.client_address, "http"),
                     ("client_ray", head.client_address, "ray"), ("raw_tcp", "", "raw")]  # fmt: skip
            runs: dict[str, list[dict[str, Any]]] = {m[0]: [] for m in modes}
            base = 0
            for rnd in range(rounds):  # interleaved rounds, order rotated: load from other jobs hits all modes alike
                for name, address, transport in modes[rnd % len(modes) :] + modes[: rnd % len(modes)]:
                    argv = ([sys.executable, "-c", RAW_TRAINER, str(raw_port), str(raw_len), str(iters)] if transport == "raw"
                            else [sys.executable, "-c", TRAINER, job + ("-store" if name.endswith("via_store") else ""),
                                  address, transport, str(iters), str(base)])  # fmt: skip
                    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
                    if proc.returncode != 0:
                        raise RuntimeError(f"{name} trainer failed:\n{proc.stderr[-3000:]}")
                    runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                    base += iters + 3
            for name, rs in runs.items():
                per[name] = {
                    "mib_per_s": statistics.median(r["mib_per_s"] for r in rs),
                    "batches_per_s": statistics.median(r["batches_per_s"] for r in rs),
                    "rounds_mib_per_s": [round(r["mib_per_s"], 1) for r in rs],
                }
            per["ratio_client_http_to_direct"] = per["client_http"]["mib_per_s"] / per["direct"]["mib_per_s"]
            per["ratio_client_http_via_store_to_direct"] = per["client_http_via_store"]["mib_per_s"] / per["direct"]["mib_per_s"]
            per["ratio_client_ray_to_direct"] = per["client_ray"]["mib_per_s"] / per["direct"]["mib_per_s"]
            # The ceiling of any socket path here: the same bytes over a bare loopback TCP socket.
            per["ratio_raw_tcp_to_direct"] = per["raw_tcp"]["mib_per_s"] / per["direct"]["mib_per_s"]
            per["ratio_client_http_to_raw_tcp"] = per["client_http"]["mib_per_s"] / per["raw_tcp"]["mib_per_s"]
            results["sizes"][f"{mib:g}MiB"] = per
            for a in actors:
                ray.kill(a, no_restart=True)
            raw_server.kill()
            raw_server.wait(timeout=10)
    finally:
        for server in raw_servers:
            server.kill()
            server.wait(timeout=10)
        if ray.is_initialized():
            ray.shutdown()
        head.stop()
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[1.0, 16.0])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per mode; medians are reported")
    p.add_argument("--json-out")
    p.add_argument("--smoke", action="store_true", help="0.25 MiB, 2 fetches, 1 round of every mode (what CI runs)")
    args = p.parse_args()
    if args.smoke:
        args.sizes_mib, args.iters, args.rounds = [0.25], 2, 1
    started = time.time()
    results = run(args.sizes_mib, args.iters, args.rounds)
    results["wall_s"] = time.time() - started
    text = json.dumps(results, indent=1)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    parts = []
    for size, r in results["sizes"].items():
        parts.append(
            f"{size}: client_http {r['client_http']['mib_per_s']:.0f} MiB/s ({r['client_http']['batches_per_s']:.1f}/s), "
            f"via store {r['client_http_via_store']['mib_per_s']:.0f}, "
            f"client_ray {r['client_ray']['mib_per_s']:.0f}, direct {r['direct']['mib_per_s']:.0f} MiB/s "
            f"({r['direct']['batches_per_s']:.1f}/s), raw tcp {r['raw_tcp']['mib_per_s']:.0f}, "
            f"http/direct {r['ratio_client_http_to_direct']:.2f}, raw tcp/direct {r['ratio_raw_tcp_to_direct']:.2f}"
        )
    print("rollout_stream_bench: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
