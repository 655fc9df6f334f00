"""`rljob run examples/tiny-cpu-2ranks.yaml`: two reference trainer processes (gloo on loopback) over
the HTTP controller API, with generation overlapped with training; real vLLM, Ray and torch.

Three steps (one engine cell, about 3.3 GiB, a minute or so): each rank trains every step on its
own half of the rollout (whole GRPO groups, disjoint, together the 8 prompts), on samples at most
maxStaleness behind; with overlap some batch holds samples of the previous version (rollout n+1
was generated while the ranks trained on n); no process outlives the run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_local_run import REPO, needs_engine, rljob, still_running

EXAMPLE = REPO / "examples" / "tiny-cpu-2ranks.yaml"
STEPS = 3


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_engine)])
def test_two_trainer_ranks_train_every_step_on_disjoint_halves_with_overlap(tmp_path: Path, _: None) -> None:
    out = tmp_path / "run"
    result = rljob("run", str(EXAMPLE.relative_to(REPO)), "--steps", str(STEPS), "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is True and summary["failure"] is None
    assert summary["weight_versions"] == list(range(1, STEPS + 1))
    assert all(s["samples"] == 32 for s in summary["per_step"]), "rank 0's half: 4 prompts x 8 samples"

    batches = [json.loads(line) for name in ("trainer-batches.jsonl", "trainer-batches-rank1.jsonl")
               for line in (out / name).read_text().splitlines()]
    stale_seen = False
    for step in range(STEPS):
        by_rank = {b["rank"]: b for b in batches if b["step"] == step}
        assert set(by_rank) == {0, 1}, f"step {step}: every rank got its batch once"
        p0, p1 = set(by_rank[0]["prompts"]), set(by_rank[1]["prompts"])
        assert not p0 & p1 and len(p0 | p1) == 8, f"step {step}: disjoint halves of the 8 prompts"
        versions = set(by_rank[0]["weight_versions"]) | set(by_rank[1]["weight_versions"])
        assert all(step - 1 <= v <= step for v in versions), f"step {step}: {versions} beyond maxStaleness 1"
        stale_seen |= step > 0 and (step - 1) in versions
    assert stale_seen, "with overlap, rollout n+1 is generated (partly) on the weights before step n's update"

    assert (out / "logs" / "trainer-rank1.log").exists() and (out / "trainer-steps-rank1.jsonl").exists()
    pids = json.loads((out / "pids.json").read_text())
    assert sum(r["what"] == "trainer" for r in pids["processes"]) == 2
    assert pids["left_after_exit"] == [] and [r for r in pids["processes"] if still_running(r)] == []
