"""Measure the vLLM CPU server's startup time and reload_weights latency on the tiny model.

    .venv/bin/python bench/vllm_startup_reload.py [--starts 1] [--reloads 20] [--json-out FILE]

Startup: process start → first GET /health 200, then → first completion answered (the first
request pays for lazy initialisation). Reload: POST /collective_rpc reload_weights, alternating
between two tiny models (seeds 0 and 1), timed at the client; each reload is checked to have
changed the greedy output, so a no-op reload cannot pass for a fast one.
Prints one JSON object, then a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the launcher lives with the test fixtures

from controller_runtime.clients import VLLMClient  # noqa: E402
from tests.fixtures.vllm_server import (  # noqa: E402
    VLLMServer,
    start_vllm_server,
    stop_vllm_server,
    tiny_model_path,
)

PROMPT = [1, 20, 300, 40]


def rss_gib(server: VLLMServer) -> float:
    """Resident memory of every process in the server's process group (API server + engine core)."""
    assert server.process is not None
    pgid = os.getpgid(server.process.pid)
    total_kib = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total_kib / 2**20


async def greedy(client: VLLMClient) -> tuple[int, ...]:
    reply = await client.completions(PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=False)
    return reply.choices[0].token_ids


async def time_reloads(endpoint: str, models: list[Path], n: int) -> dict[str, Any]:
    client = VLLMClient(endpoint, timeout=120.0)
    try:
        outputs = {}
        for m in models:  # learn each model's greedy output once
            await client.reload_weights(str(m))
            outputs[m] = await greedy(client)
        if outputs[models[0]] == outputs[models[1]]:
            raise SystemExit("both models give the same greedy tokens: the reload check would be void")
        times = []
        for i in range(n):
            target = models[i % 2]  # the server holds models[1] now: every reload changes weights
            start = time.perf_counter()
            await client.reload_weights(str(target))
            times.append(time.perf_counter() - start)
            if await greedy(client) != outputs[target]:
                raise SystemExit(f"reload {i} to {target} did not change the served weights")
        await client.reload_weights(str(models[0]))
        return {
            "n": n,
            "min_ms": min(times) * 1e3,
            "median_ms": statistics.median(times) * 1e3,
            "max_ms": max(times) * 1e3,
        }
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=1, help="server starts to time")
    parser.add_argument("--reloads", type=int, default=20, help="reloads to time (on the last server)")
    parser.add_argument("--json-out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    models = [tiny_model_path(0), tiny_model_path(1)]
    starts: list[dict[str, float]] = []
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "model": str(models[0])}
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as tmp:
        for i in range(args.starts):
            server = start_vllm_server(models[0], log_path=Path(tmp) / f"server{i}.log")
            try:
                starts.append(
                    {
                        "health_s": server.startup_s,
                        "first_completion_s": server.first_completion_s,
                        "rss_gib": rss_gib(server),
                    }
                )
                if i == args.starts - 1:
                    result["reload_weights"] = asyncio.run(
                        time_reloads(server.endpoint, models, args.reloads)
                    )
            finally:
                stop_vllm_server(server)
    result["startup"] = starts
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    rl = result["reload_weights"]
    health = statistics.median(s["health_s"] for s in starts)
    first = statistics.median(s["first_completion_s"] for s in starts)
    rss = max(s["rss_gib"] for s in starts)
    print(
        f"vLLM CPU tiny model: startup to /health {health:.1f}s, to first completion {first:.1f}s "
        f"(median of {len(starts)}), RSS {rss:.2f} GiB; reload_weights median {rl['median_ms']:.1f} ms "
        f"(min {rl['min_ms']:.1f}, max {rl['max_ms']:.1f}, n={rl['n']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
