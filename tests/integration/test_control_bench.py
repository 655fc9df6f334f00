"""bench/control_bench.py in its smoke mode, so that the benchmark cannot rot: a 2-cell job of
stand-in engines on the test cluster, the real operator, the trainer's client authenticated with
a ServiceAccount token; 3 rounds of every verb through the API and of the same engine calls made
directly. Latencies are measurements (bench/RESULTS.md), not something a test asserts."""

from __future__ import annotations

import pytest

from bench.control_bench import bench, summary_line

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

VERBS = ("start_update_weights", "end_update_weights", "offload", "onload", "cells")


def test_control_bench_smoke_pairs_every_verb_with_its_direct_engine_calls(cluster, namespace) -> None:
    result = bench(cluster, namespace, cells=[2], iters=3, vllm=False)
    job = result["jobs"]["ctl-2"]
    assert job["n_cells"] == 2 and job["engine"] == "standin"
    for verb in VERBS:
        assert job[verb]["calls"] == 3 and job[verb]["api"]["p50_ms"] > 0, (verb, job[verb])
    assert job["offload"]["direct"]["p50_ms"] > 0 and job["onload"]["direct"]["p50_ms"] > 0
    assert job["window"]["calls"] == 3
    assert summary_line(result).startswith("control_bench: added latency p50: ctl-2 (standin)")
