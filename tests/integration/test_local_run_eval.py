"""`rljob run examples/tiny-cpu-eval.yaml --steps 4` with spec.rollout.eval.everySteps 2: the
policy is evaluated on the policy fleet after steps 2 and 4, the points are in the summary and
the curve, and the controller's status.lastEval holds the last one (real vLLM, Ray, torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.test_local_run import REPO, RUN_TIMEOUT_S, needs_engine

EXAMPLE = REPO / "examples" / "tiny-cpu-eval.yaml"


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_engine)])
def test_local_run_evaluates_the_policy_every_n_steps(tmp_path: Path, _: None) -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["rollout"]["eval"]["everySteps"] = 2
    manifest["spec"]["rollout"]["dataset"]["path"] = str(REPO / manifest["spec"]["rollout"]["dataset"]["path"])
    manifest["spec"]["model"]["path"] = str(REPO / manifest["spec"]["model"]["path"])
    path = tmp_path / "tiny-eval.yaml"
    path.write_text(yaml.safe_dump(manifest))
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "rljob_cli.main", "run", str(path), "--steps", "4", "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is True and summary["steps"] == 4
    evals = summary["evals"]
    assert [e["step"] for e in evals] == [2, 4] and not any(e["skipped"] for e in evals), evals
    for e in evals:
        assert e["fleet"] == "policy" and e["samples"] == 16  # 16 prompts x 1 greedy sample
        assert e["weight_version"] == str(e["step"])  # generated on the step's weights
        assert 0.0 <= e["pass_at_1"] <= 1.0 and 0.0 <= e["reward"] <= 1.0
    last = summary["status"]["lastEval"]
    assert (last["step"], last["weightVersion"], last["fleet"]) == (4, "4", "policy")
    assert last["passAt1"] == pytest.approx(evals[-1]["pass_at_1"])
    assert last["reward"] == pytest.approx(evals[-1]["reward"]) and last["time"]
    assert summary["last_eval"]["step"] == 4
    assert "eval after step 2: mean reward" in result.stderr
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
