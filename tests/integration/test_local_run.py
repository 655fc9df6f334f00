"""`rljob run examples/tiny-cpu.yaml` as a user runs it: real vLLM, real Ray, real torch, a subprocess.

One engine cell (about 3.3 GiB) at a time. The first test runs four steps and checks the
artefacts and that no process outlives the run; a second run in the same directory is then
interrupted with SIGINT after its first step and must stop everything too. The refusals
(a GPU manifest, a missing dataset) must fail before any process starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"
RLJOB = [sys.executable, "-m", "rljob_cli.main"]
RUN_TIMEOUT_S = 900

needs_engine = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (CPU build) is not installed"),
    pytest.mark.vllm,
    pytest.mark.ray,
    pytest.mark.slow,
]


def rljob(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RLJOB, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def still_running(record: dict[str, Any]) -> bool:
    try:
        p = psutil.Process(record["pid"])
        return abs(p.create_time() - record["create_time"]) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_no_process_left(out: Path, job: str = "tiny-cpu") -> dict[str, Any]:
    pids = json.loads((out / "pids.json").read_text())
    records = pids["processes"]
    whats = {r["what"] for r in records}
    assert "executor" in whats and any(w.startswith(f"{job}-cell-0-g") for w in whats), whats
    assert any("raylet" in r["cmd"] for r in records), "the Ray head's processes were recorded"
    assert pids["left_after_exit"] == []
    left = [r for r in records if still_running(r)]
    assert left == [], f"processes outlived the run: {left}"
    return pids


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_engine)])
def test_tiny_cpu_run_trains_and_leaves_nothing_running(tmp_path: Path, _: None) -> None:
    out = tmp_path / "run"
    result = rljob("run", str(EXAMPLE.relative_to(REPO)), "--steps", "4", "--out", str(out))
    assert result.returncode == 0, result.stderr[-4000:]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is True and summary["failure"] is None
    assert summary["steps"] == 4 and len(summary["rewards"]) == 4
    assert all(0.0 <= r <= 1.0 for r in summary["rewards"])
    assert summary["weight_versions"] == [1, 2, 3, 4]
    assert summary["first5_mean_reward"] is not None and summary["last5_mean_reward"] is not None
    for step in summary["per_step"]:
        assert step["samples"] == 64  # 8 prompts x 8 samples
        # every sample was generated under a version at most maxStaleness (1) behind
        assert all(step["weight_version"] - 1 - v <= 1 for v in step["batch_weight_versions"])
    png = (out / "reward_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(str(out / "reward_curve.png")).shape[0] > 100
    assert sorted(p.name for p in (out / "weights").iterdir()) == ["v3", "v4"]  # the last two versions
    assert_no_process_left(out)
    assert "mean reward: first 4 steps" in result.stderr

    # A second run in the same directory: its engine is killed after the first step (the
    # controller must replace it and training must go on), then the run gets SIGINT (Ctrl-C).
    log = tmp_path / "second.log"
    with open(log, "w") as logf:
        proc = subprocess.Popen([*RLJOB, "run", str(EXAMPLE), "--steps", "500", "--out", str(out)],
                                cwd=REPO, stdout=logf, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_log(proc, log, lambda text: "step 1/500" in text)
        engine = next(r for r in json.loads((out / "pids.json").read_text())["processes"]
                      if r["what"] == "tiny-cpu-cell-0-g0")
        os.killpg(engine["pid"], signal.SIGKILL)  # the engine crashes (API server and EngineCore)
        killed_at = len(log.read_text())
        wait_for_log(proc, log, lambda text: step_after_serving_again(text[killed_at:]))
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, log.read_text()[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and summary["completed"] is False
    assert 2 <= summary["steps"] < 500
    assert summary["weight_versions"] == list(range(1, summary["steps"] + 1))  # this run's, not the first's
    assert summary["engine_restarts"] >= 1 and summary["engine_processes_started"] >= 2
    pids = assert_no_process_left(out)
    assert {"tiny-cpu-cell-0-g0", "tiny-cpu-cell-0-g1"} <= {r["what"] for r in pids["processes"]}


def step_after_serving_again(text: str) -> bool:
    """The replaced cell serves again and a training step completed after that."""
    at = text.find("CellServing [tiny-cpu-cell-0]")
    return at >= 0 and "/500: reward" in text[at:]


def wait_for_log(proc: subprocess.Popen[str], log: Path, seen: Callable[[str], bool]) -> None:
    """Poll the run's log until `seen` holds; the run must stay alive meanwhile."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not seen(log.read_text()):
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, f"not seen within {RUN_TIMEOUT_S} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_engine)])
def test_a_runner_killed_with_sigkill_takes_every_child_with_it(tmp_path: Path, _: None) -> None:
    """SIGKILL cannot be handled: the children die with their parent (PR_SET_PDEATHSIG)."""
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    with open(log, "w") as logf:
        proc = subprocess.Popen([*RLJOB, "run", str(EXAMPLE), "--steps", "500", "--out", str(out)],
                                cwd=REPO, stdout=logf, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_log(proc, log, lambda text: "step 1/500" in text)
        records = json.loads((out / "pids.json").read_text())["processes"]
        assert {r["what"] for r in records} >= {"executor", "tiny-cpu-cell-0-g0"}
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 120
        while (left := [r for r in records if still_running(r)]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == [], f"processes outlived a SIGKILLed runner: {[(r['what'], r['cmd'][:80]) for r in left]}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for r in json.loads((out / "pids.json").read_text())["processes"] if (out / "pids.json").exists() else []:
            if still_running(r):
                os.kill(r["pid"], signal.SIGKILL)


def write_variant(tmp_path: Path, edit: dict[str, Any]) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    for dotted, value in edit.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = value
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_gpu_manifest_fails_fast_with_the_scale_down_hint(tmp_path: Path) -> None:
    manifest = write_variant(tmp_path, {"spec.inference.gpusPerEngine": 8, "spec.inference.replicas": 4})
    out = tmp_path / "out"
    result = rljob("run", str(manifest), "--out", str(out), timeout=120)
    assert result.returncode == 2, result.stderr
    assert "spec.inference.gpusPerEngine is 8" in result.stderr
    assert "gpusPerEngine: 0" in result.stderr and "replicas: 1" in result.stderr
    assert not (out / "pids.json").exists()  # refused before any process started


def test_a_missing_dataset_fails_naming_the_field(tmp_path: Path) -> None:
    manifest = write_variant(tmp_path, {"spec.rollout.dataset.path": "examples/data/no-such-file.jsonl"})
    out = tmp_path / "out"
    result = rljob("run", str(manifest), "--out", str(out), timeout=120)
    assert result.returncode == 2, result.stderr
    assert "spec.rollout.dataset.path" in result.stderr and "no-such-file.jsonl" in result.stderr
    assert not (out / "pids.json").exists()


def test_an_invalid_field_is_named(tmp_path: Path) -> None:
    manifest = write_variant(tmp_path, {"spec.inference.replicas": "many"})
    result = rljob("run", str(manifest), "--out", str(tmp_path / "out"), timeout=120)
    assert result.returncode == 2
    assert "spec.inference.replicas" in result.stderr

