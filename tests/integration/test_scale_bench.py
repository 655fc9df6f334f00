"""bench/scale_bench.py --smoke on the test cluster: 2 RLJobs (16 engine pods on the fleet
stand-in) under the real operator, and 2 RayClusters under the real KubeRay when its build is
there, so that the benchmark cannot rot. What it pins down beyond "it runs": a steady state in
which every cell is probed every second writes nothing but the Lease (the operator's writes
as the API server's audit log records them), which failed before probe times stopped being
written on their own. The figures themselves are measurements (bench/RESULTS.md)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.cluster.fixtures import REPO_ROOT


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scale_bench", REPO_ROOT / "bench" / "scale_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scale_bench"] = module
    spec.loader.exec_module(module)
    return module


def test_the_smoke_run_measures_both_fleets_and_a_steady_state_that_writes_only_the_lease(cluster, tmp_path) -> None:
    bench = load_bench()
    result = bench.run(bench.parse_args(["--smoke", "--log-dir", str(tmp_path)]), cluster)
    (row,) = result["runs"]
    rl = row["rljob"]
    assert rl["jobs"] == 2 and rl["pods"] == 16 and rl["changes"] == 2
    assert 0 < rl["pods_created_seconds"] <= rl["ready_seconds"]
    assert rl["requests_ramp_by_verb"].get("POST", 0) >= 16  # the engine pods, counted by the API server
    audited = rl["steady_operator_writes_audited"]
    assert audited.get("update leases", 0) >= 1, audited  # the Lease renews: the audit log is being read
    assert set(audited) == {"update leases"}, f"steady state wrote more than the Lease: {audited}"
    assert rl["operator_peak_rss_mib"] > 0 and rl["change_latency_seconds"]["p99"] is not None
    each = rl["change_latencies_seconds"]  # every change's own, so a slow one can be traced by its place
    assert len(each) == 2 and all(v is not None and v > 0 for v in each), each
    assert max(each) == rl["change_latency_seconds"]["max"], (each, rl["change_latency_seconds"])
    if "kuberay" in row:
        kr = row["kuberay"]
        assert kr["pods"] == 16 and 0 < kr["ready_seconds"] and kr["changes"] == 2
    assert bench.summary_line(result).startswith("scale_bench: N=2")
