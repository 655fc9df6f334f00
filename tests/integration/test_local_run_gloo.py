"""`rljob run examples/tiny-cpu.yaml` with weightUpdate.method gloo and checkWeights: every
window broadcasts into the real vLLM CPU engine through the worker extension, and the
controller checks every tensor the trainer sent against what the engine received."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.test_local_run import (
    EXAMPLE,
    REPO,
    RUN_TIMEOUT_S,
    assert_no_process_left,
    needs_engine,
)


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_engine)])
def test_tiny_cpu_run_with_gloo_updates_every_step_and_checks_every_tensor(tmp_path: Path, _: None) -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["rollout"]["dataset"]["path"] = str(REPO / manifest["spec"]["rollout"]["dataset"]["path"])
    manifest["spec"]["model"]["path"] = str(REPO / manifest["spec"]["model"]["path"])
    manifest["spec"]["inference"]["weightUpdate"] = {"method": "gloo", "checkWeights": True, "bucketMegabytes": 1}
    path = tmp_path / "tiny-gloo.yaml"
    path.write_text(yaml.safe_dump(manifest))
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "rljob_cli.main", "run", str(path), "--steps", "3", "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is True and summary["weight_versions"] == [1, 2, 3]
    assert not (out / "weights").exists() or not any((out / "weights").iterdir())  # nothing went through disk
    audit = [json.loads(line) for f in (out / "logs").glob("*.jsonl") for line in f.read_text().splitlines()]
    checks = [r for r in audit if r["type"] == "weight_check"]
    updates = [r for r in audit if r["type"] == "weights_updated"]
    assert len(checks) == len(updates) >= 4  # v0 (the initial weights) and every step's
    assert all(c["ok"] and c["mismatched"] == {} for c in checks), checks
    assert_no_process_left(out)
