"""bench/heal_bench.py in its smoke mode, so that the benchmark cannot rot: one SIGKILL and one
SIGSTOP of a stand-in engine at 1 s x 2 probes on the test cluster, under the real operator. The
seconds are measurements (bench/RESULTS.md), not something a test asserts; what is pinned is that
every moment of each trial was seen, in the order healing must take."""

from __future__ import annotations

import pytest

from bench.heal_bench import Setting, bench, summary_line

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def test_heal_bench_smoke_sees_every_moment_of_a_kill_and_a_hang(cluster, namespace) -> None:
    result = bench(cluster, namespace, [Setting(1, 2)], [1], ["kill", "hang"], cells=2, engine_starts=1)
    assert len(result["engine_start_s"]) == 1 and result["engine_start_s"][0] > 0
    for fault in ("kill", "hang"):
        r = result["settings"]["1x2"][fault]
        assert r["trials"] == 1 and r["limit_s"] == (2 if fault == "kill" else 3)
        (trial,) = r["raw_s"]
        assert None not in trial.values(), trial
        assert 0 < trial["unhealthy_decided"] <= trial["pod_created"] <= trial["pending_weights"], trial
    assert "1x2 kill" in summary_line(result) and "1x2 hang" in summary_line(result)
