"""`rljob run examples/byo-fsdp2.yaml`: examples/trainers/fsdp2.py on 2 ranks (FSDP2, gloo on CPU) through the
SDK, on the tiny task: the reward rises, every version is published, a sharded checkpoint is written
(real vLLM, Ray, torch.distributed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.test_local_run import REPO, RUN_TIMEOUT_S, assert_no_process_left, needs_engine

EXAMPLE = REPO / "examples" / "byo-fsdp2.yaml"
STEPS = 12


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_engine)])
def test_the_fsdp2_example_on_two_ranks_raises_the_reward(tmp_path: Path, _: None) -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    spec = manifest["spec"]
    spec["rollout"]["dataset"]["path"] = str(REPO / spec["rollout"]["dataset"]["path"])
    spec["model"]["path"] = str(REPO / spec["model"]["path"])
    spec["trainer"]["command"] = ["python", str(REPO / "examples" / "trainers" / "fsdp2.py")]
    path = tmp_path / "fsdp2.yaml"
    path.write_text(yaml.safe_dump(manifest))
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rljob_cli.main", "run", str(path), "--steps", str(STEPS), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    logs = {p.name: p.read_text(errors="replace") for p in (out / "logs").glob("trainer*.log")}
    assert result.returncode == 0, result.stderr[-3000:] + "".join(v[-2000:] for v in logs.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is True and summary["weight_versions"] == list(range(1, STEPS + 1))
    rewards = summary["rewards"]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.05, rewards
    assert {"trainer.log", "trainer-rank1.log"} <= set(logs)
    ckpt = out / "weights" / "byo-fsdp2" / "checkpoints" / "step-10"
    assert (ckpt / ".metadata").is_file() and len(list(ckpt.glob("*.distcp"))) == 2
    assert_no_process_left(out, job="byo-fsdp2")
