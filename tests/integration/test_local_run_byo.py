"""`rljob run examples/byo-trainer.yaml`: a trainer of your own (examples/trainers/minimal.py, plain torch on
the SDK) runs as `spec.trainer.command` with a trainer pod's environment and learns (real vLLM, Ray, torch).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.test_local_run import REPO, RUN_TIMEOUT_S, assert_no_process_left, needs_engine

EXAMPLE = REPO / "examples" / "byo-trainer.yaml"
STEPS = 12


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_engine)])
def test_the_minimal_trainer_of_your_own_raises_the_reward_through_the_sdk(tmp_path: Path, _: None) -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    spec = manifest["spec"]
    spec["rollout"]["dataset"]["path"] = str(REPO / spec["rollout"]["dataset"]["path"])
    spec["model"]["path"] = str(REPO / spec["model"]["path"])
    spec["trainer"]["command"] = ["python", str(REPO / "examples" / "trainers" / "minimal.py")]
    path = tmp_path / "byo.yaml"
    path.write_text(yaml.safe_dump(manifest))
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rljob_cli.main", "run", str(path), "--steps", str(STEPS), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    log = (out / "logs" / "trainer.log").read_text(errors="replace") if (out / "logs" / "trainer.log").exists() else ""
    assert result.returncode == 0, result.stderr[-3000:] + log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is True and summary["steps"] == STEPS
    assert summary["weight_versions"] == list(range(1, STEPS + 1))
    rewards = summary["rewards"]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.05, rewards

    # the trainer was the user's program, its versions streamed by the SDK (the tiny model fits one bucket)
    assert "step 11: reward" in log
    assert (out / "weights" / "byo-trainer" / f"v{STEPS}" / "model.safetensors").is_file()
    assert_no_process_left(out, job="byo-trainer")
