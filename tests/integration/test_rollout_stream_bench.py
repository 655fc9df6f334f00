"""bench/rollout_stream_bench.py in its smoke mode, so that the benchmark cannot rot (it did once:
its stand-in executor lacked a metrics method the actor had begun to call, and every side-channel
fetch answered HTTP 500). Its own process, as `bench/run --smoke` runs it: the benchmark starts a
Ray head and connects to it as a driver, which must not become this test process's Ray. Rates are
measurements (bench/RESULTS.md), not something a test asserts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
MODES = ("direct", "client_http", "client_http_via_store", "client_ray", "raw_tcp")


def test_rollout_stream_bench_smoke_fetches_through_every_mode() -> None:
    proc = subprocess.run([sys.executable, "bench/rollout_stream_bench.py", "--smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=280)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    *body, summary = proc.stdout.strip().splitlines()
    result = json.loads("\n".join(body))
    size = result["sizes"]["0.25MiB"]
    for mode in MODES:
        assert size[mode]["mib_per_s"] > 0 and len(size[mode]["rounds_mib_per_s"]) == 1, (mode, size[mode])
    assert summary.startswith("rollout_stream_bench: 0.25MiB: client_http ")
