"""bench/soak.py --smoke on the test cluster, so that the soak cannot rot between its long runs:
one churn cycle (create, scale, suspend, resume, SIGKILL an engine, a window, delete) and one
operator restart, every step succeeding, the operator sampled in both segments, and the
history invariants holding over the audit log (the soak's own check, and this suite's after
the test). The growth fit itself is checked on made-up samples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", REPO_ROOT / "bench" / "soak.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_growth_is_fitted_per_segment_after_the_warm_up() -> None:
    soak = load_soak()
    # Segment 1: warm-up jump, then +10 % per hour of RSS; segment 2 (after a restart): flat.
    rows = [soak.Sample(0, 1, 50.0, 10, 40.0)] + [
        soak.Sample(t, 1, 100.0 * (1 + 0.1 * (t - 60) / 3600), 12, 40.0) for t in (60, 120, 180, 240)
    ]
    rows += [soak.Sample(t, 2, 80.0, 12, 41.0) for t in (300, 360, 420, 480)]
    g = soak.growth(rows, warmup=1)
    assert [s["rss_mib_pct_per_hour"] for s in g["segments"]] == [10.0, 0.0]
    assert g["rss_mib_max_pct_per_hour"] == 10.0 and g["fds_max_pct_per_hour"] == 0.0
    # Pooled: one slope for both segments (each its own intercept), weighted by their spread in
    # time: 10 %/h of 100 over 18000 s^2 and 0 over 7200 s^2 -> 7.14 MiB/h of a mean start of 90.
    assert g["pooled"]["rss_mib"]["pct_per_hour"] == pytest.approx(7.94, abs=0.01)
    assert g["pooled"]["fds"]["pct_per_hour"] == 0.0 and g["pooled"]["rss_mib"]["samples"] == 7
    assert g["met"] is False
    assert (
        soak.growth([soak.Sample(0, 1, 1.0, 1, 1.0)], warmup=0)["segments"][0]["rss_mib_pct_per_hour"] is None
    )


@pytest.mark.timeout(150)
def test_soak_smoke(cluster, namespace, tmp_path) -> None:
    soak = load_soak()
    result, _ = soak.run(cluster, namespace, log_dir=tmp_path, smoke=True, **soak.SMOKE)
    assert result["step_failures"] == [] and result["history_violations"] == [], result
    assert result["cycles"] == 1 and result["operator_restarts"] == 1
    assert {s["segment"] for s in result["samples"]} == {1, 2}
    assert all(s["rss_mib"] > 0 and s["fds"] > 0 and s["tasks"] for s in result["samples"]), result["samples"]
    assert result["steady_job"]["ready"] == "2/2" and result["steady_job"]["restartsTotal"] == 1
    assert "soak:" in soak.summary_line(result)
