"""bench/overlap_bench.py --smoke: the real TrainingLoop on the fakes, simulated generation and
training times, so that the benchmark cannot rot; the call order overlap produces is pinned in
test_trainer_overlap.py."""

from __future__ import annotations

import importlib.util
import sys
from argparse import Namespace
from types import ModuleType

from tests.unit.crd_cases import REPO_ROOT


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("overlap_bench", REPO_ROOT / "bench" / "overlap_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["overlap_bench"] = module
    spec.loader.exec_module(module)
    return module


def test_the_smoke_run_reports_both_modes_over_the_same_samples() -> None:
    bench = load_bench()
    result = bench.smoke(Namespace())
    sync, overlap = result["modes"]["sync"], result["modes"]["overlap"]
    assert result["same_samples"] and sync["samples"] == overlap["samples"] == 6 * 64
    assert sync["rewards"] == overlap["rewards"], "the same rollouts, in the same order"
    # The ratio itself is a measurement (bench/RESULTS.md), not something a test asserts.
    assert result["samples_per_second_ratio"] > 0 and "ratio" in bench.summary_line(result)


def test_split_cores_binds_the_engine_and_the_rest_of_the_run_apart() -> None:
    bench = load_bench()
    assert bench.split_env("0:1") == {"VLLM_CPU_OMP_THREADS_BIND": "0", "RLJOB_BENCH_CPUS": "1"}
    assert bench.split_env(None) == {}
