"""A trainer process killed with SIGKILL mid-run resumes from its last checkpoint.

`rljob run --trainer-process` runs `python -m rljob_client.trainer` as a trainer pod runs it
(HTTP controller API, Ray Client to the executor) and starts it again when it is killed, as
Kubernetes replaces an evicted pod. The executor, engines and controller live on. The same run
shows the pod trainer's path itself (windows opened over HTTP by `trainer-0`): a local run
starts its own engine, too dear in CI's budget for a second run that only shows that.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from rollout_executor.dataset import PromptDataset

from tests.integration.test_local_run import assert_no_process_left

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"
RLJOB = [sys.executable, "-m", "rljob_cli.main"]
RUN_TIMEOUT_S = 900
STEPS, SAVE_EVERY, EVAL_EVERY = 6, 2, 3

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (CPU build) is not installed"),
    pytest.mark.vllm,
    pytest.mark.ray,
    pytest.mark.slow,
]


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def still_running(record: dict[str, Any]) -> bool:
    try:
        p = psutil.Process(record["pid"])
        return abs(p.create_time() - record["create_time"]) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_trainer_killed_with_sigkill_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["spec"]["trainer"]["reference"]["saveEverySteps"] = SAVE_EVERY
    # Eval points from the trainer process reach the summary and the curve, a redone one replacing the first.
    data["spec"]["rollout"]["eval"] = {"everySteps": EVAL_EVERY, "maxPrompts": 16, "maxTokens": 16}
    manifest = tmp_path / "resume.yaml"
    manifest.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    steps_file, batches_file = out / "trainer-steps.jsonl", out / "trainer-batches.jsonl"
    checkpoints = out / "weights" / "tiny-cpu" / "checkpoints"
    log = tmp_path / "run.log"
    with open(log, "w") as logf:
        proc = subprocess.Popen([*RLJOB, "run", str(manifest), "--steps", str(STEPS), "--trainer-process", "--out", str(out)],
                                cwd=REPO, stdout=logf, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        # Mid-run: three steps trained, so the newest checkpoint (after step 1) is behind the trainer.
        while len(jsonl(steps_file)) < 3 or not (checkpoints / "step-2" / "manifest.json").exists():
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        trainer = [r for r in json.loads((out / "pids.json").read_text())["processes"] if r["what"] == "trainer"]
        assert len(trainer) == 1
        os.kill(trainer[0]["pid"], signal.SIGKILL)
        trained_before_kill = len(jsonl(steps_file))
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-4000:]
    trainer_log = (out / "logs" / "trainer.log").read_text()
    assert "the trainer was killed (SIGKILL); starting it again (1/3)" in log.read_text()

    records = jsonl(steps_file)
    first = [r["step"] for r in records[:trained_before_kill]]
    second = [r["step"] for r in records[trained_before_kill:]]
    resumed = second[0]
    assert first == list(range(trained_before_kill))
    # Resumed at a checkpoint: the steps since it are redone, nothing before it, nothing skipped.
    assert resumed % SAVE_EVERY == 0 and trained_before_kill - SAVE_EVERY <= resumed <= trained_before_kill
    assert second == list(range(resumed, STEPS))
    found = re.search(r"resumed from checkpoint \S+: step (\d+), weights v(\d+), (\d+) optimizer steps", trainer_log)
    assert found is not None, trainer_log[-3000:]
    assert [int(g) for g in found.groups()] == [resumed, resumed, resumed], "weights and optimizer state came back"

    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is True and summary["steps"] == STEPS
    assert summary["weight_versions"] == list(range(1, STEPS + 1)), "the curve is the resumed run's lineage"
    evals = summary["evals"]
    assert [e["step"] for e in evals] == [3, 6] and not any(e["skipped"] for e in evals), evals
    assert [e["weight_version"] for e in evals] == ["3", "6"]
    assert summary["status"]["lastEval"]["passAt1"] == pytest.approx(evals[-1]["pass_at_1"])

    # Prompts: every step of the lineage trained on the dataset's order, and a redone step got the
    # very prompts of its first attempt (none skipped, none repeated).
    ds = PromptDataset.from_path(str(REPO / data["spec"]["rollout"]["dataset"]["path"]), label_field=None,
                                 seed=data["spec"]["rollout"]["dataset"].get("seed", 0))
    batch_size = data["spec"]["rollout"]["batchSize"]
    expected = [sorted(p.index for p in ds.take(batch_size)) for _ in range(STEPS)]
    got: dict[int, list[list[int]]] = {}
    for line in jsonl(batches_file):
        got.setdefault(line["step"], []).append(line["prompts"])
    assert sorted(got) == list(range(STEPS))
    for step, seen in got.items():
        assert all(p == expected[step] for p in seen), (step, seen, expected[step])
    assert len(got[resumed]) == 2, "the step after the checkpoint was fetched by both trainers"

    # The pod trainer's path: weights pushed by the trainer process, windows opened over HTTP.
    assert "weights v2: pushing to 1 engines" in trainer_log
    audit = [json.loads(line) for line in (out / "logs" / "inference_controller.jsonl").read_text().splitlines()]
    assert any(r.get("type") == "weights_updated" and r.get("holder") == "trainer-0" for r in audit), \
        "the windows were opened over HTTP by the trainer process"

    pids = json.loads((out / "pids.json").read_text())["processes"]
    assert len([r for r in pids if r["what"] == "trainer"]) == 2
    assert [r["what"] for r in pids if still_running(r)] == []
    assert_no_process_left(out)
