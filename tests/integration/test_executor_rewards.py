"""Rewards off the executor's event loop, against the stand-in engine (a real process).

A synchronous reward runs in worker processes, so generation goes on while it runs; a reward
that raises or hangs marks its sample (the configured reward, or dropped from its group) and
is counted, and the rollout completes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.integration import test_executor as base
from tests.integration.test_executor import N_PROMPTS, N_SAMPLES, StandIn, assert_complete, config

dataset = base.dataset  # the fixtures, shared
make_executor = base.make_executor

HERE = "tests.unit.reward_fixtures"  # a plain module: see its docstring


@pytest.fixture
def standin(tmp_path: Path):
    s = StandIn(tmp_path, delay=0.3)
    yield s
    s.kill()


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"vocab_size": 1000}')
    return d


async def test_a_slow_sync_reward_does_not_stall_generation(dataset: Path, model_dir: Path, tmp_path: Path,
                                                            standin: StandIn, make_executor) -> None:
    log = tmp_path / "reward.log"
    cfg = config(dataset, model_dir, [standin.url], reward_function=f"{HERE}:logged_sleep",
                 reward_args={"log": str(log), "seconds": 1.0}, reward_workers=1)
    ex = await make_executor(cfg)
    done_at: list[float] = []
    complete = ex.generator.complete

    async def timed(*a, **kw):
        c = await complete(*a, **kw)
        done_at.append(time.monotonic())
        return c

    ex.generator.complete = timed  # type: ignore[method-assign]
    batch = await asyncio.wait_for(ex.get_batch(0), timeout=120)
    assert_complete(batch)
    calls = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    assert len(calls) == N_PROMPTS * N_SAMPLES
    first_start, first_end = min(calls)
    during = [t for t in done_at if first_start < t < first_end]
    assert during, "generation went on while the first reward call ran"
    # and generation finished long before scoring did: samples did not wait on each other's rewards
    assert max(done_at) < max(end for _, end in calls)


@pytest.mark.parametrize(("fn", "reason", "on_error"), [("flaky", "error", "score"), ("hangs_on_sample_1", "timeout", "score"),
                                                        ("flaky", "error", "drop")])
async def test_a_failing_reward_marks_its_samples_and_the_rollout_completes(
        dataset: Path, model_dir: Path, standin: StandIn, make_executor, fn: str, reason: str, on_error: str) -> None:
    cfg = config(dataset, model_dir, [standin.url], reward_function=f"{HERE}:{fn}", reward_args={},
                 reward_workers=2, reward_timeout_seconds=1.0, reward_on_error=on_error, reward_error_value=-1.0)
    ex = await make_executor(cfg)
    batch = await asyncio.wait_for(ex.get_batch(0), timeout=120)
    failed = batch.meta["failed_samples"]
    assert sorted((f["group"], f["sample"]) for f in failed) == [(g, 1) for g in range(N_PROMPTS)]
    assert {f["reason"] for f in failed} == {reason} and {f["source"] for f in failed} == {"reward"}
    assert all(f"{HERE}:{fn}" in f["error"] for f in failed)
    pairs = sorted(zip(batch.group_indices.tolist(), batch.sample_indices.tolist(), strict=True))
    if on_error == "drop":
        assert pairs == [(g, s) for g in range(N_PROMPTS) for s in range(N_SAMPLES) if s != 1]
        assert set(batch.rewards.tolist()) == {0.5}
    else:
        assert_complete(batch)
        for i in range(len(batch)):
            assert batch.rewards[i] == (-1.0 if batch.sample_indices[i] == 1 else 0.5)
    assert ex.stats()["failed_samples"] == {f"reward/{reason}": N_PROMPTS}
    metric = f'rljob_executor_sample_failures_total{{job="t",namespace="default",reason="{reason}",source="reward"}} {float(N_PROMPTS)}'
    assert metric in ex.metrics.exposition().decode()
    if reason == "timeout":
        assert ex.stats()["reward_workers_replaced"] == N_PROMPTS
