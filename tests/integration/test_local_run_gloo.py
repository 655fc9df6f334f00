"""`rljob run examples/tiny-cpu-eval.yaml` with weightUpdate.method gloo and checkWeights: every
window broadcasts into the real vLLM CPU engine through the worker extension, the controller
checks every tensor the trainer sent against what the engine received, and the policy is
evaluated on the policy fleet every 2 steps (real vLLM, Ray, torch).

One run serves both subjects: a local run starts its own engine (about 40 s of a CI budget that
is tight), and neither the weight path nor evaluation changes what the other checks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.test_local_run import REPO, RUN_TIMEOUT_S, assert_no_process_left, needs_engine

EXAMPLE = REPO / "examples" / "tiny-cpu-eval.yaml"
STEPS = 4


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_engine)])
def test_tiny_cpu_run_with_gloo_checks_every_tensor_and_evaluates_every_2_steps(tmp_path: Path, _: None) -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["rollout"]["dataset"]["path"] = str(REPO / manifest["spec"]["rollout"]["dataset"]["path"])
    manifest["spec"]["model"]["path"] = str(REPO / manifest["spec"]["model"]["path"])
    manifest["spec"]["inference"]["weightUpdate"] = {"method": "gloo", "checkWeights": True, "bucketMegabytes": 1}
    manifest["spec"]["rollout"]["eval"]["everySteps"] = 2
    path = tmp_path / "tiny-gloo-eval.yaml"
    path.write_text(yaml.safe_dump(manifest))
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rljob_cli.main", "run", str(path), "--steps", str(STEPS), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is True and summary["steps"] == STEPS
    assert summary["weight_versions"] == list(range(1, STEPS + 1))

    # gloo: nothing went through disk, and every window's tensors were checked on the engine.
    assert not (out / "weights").exists() or not any((out / "weights").iterdir())
    audit = [json.loads(line) for f in (out / "logs").glob("*.jsonl") for line in f.read_text().splitlines()]
    checks = [r for r in audit if r["type"] == "weight_check"]
    updates = [r for r in audit if r["type"] == "weights_updated"]
    assert len(checks) == len(updates) >= STEPS + 1  # v0 (the initial weights) and every step's
    assert all(c["ok"] and c["mismatched"] == {} for c in checks), checks

    # Evaluation after steps 2 and 4, on the weights gloo just delivered.
    evals = summary["evals"]
    assert [e["step"] for e in evals] == [2, 4] and not any(e["skipped"] for e in evals), evals
    for e in evals:
        assert e["fleet"] == "policy" and e["samples"] == 16  # 16 prompts x 1 greedy sample
        assert e["weight_version"] == str(e["step"])  # generated on the step's weights
        assert 0.0 <= e["pass_at_1"] <= 1.0 and 0.0 <= e["reward"] <= 1.0
    last = summary["status"]["lastEval"]
    assert (last["step"], last["weightVersion"], last["fleet"]) == (STEPS, str(STEPS), "policy")
    assert last["passAt1"] == pytest.approx(evals[-1]["pass_at_1"])
    assert last["reward"] == pytest.approx(evals[-1]["reward"]) and last["time"]
    assert summary["last_eval"]["step"] == STEPS
    assert "eval after step 2: mean reward" in result.stderr
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_no_process_left(out, job="tiny-cpu-eval")
