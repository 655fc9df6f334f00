"""The reward worker pool: a synchronous reward runs in worker processes, each call bounded;
a raise, a hang or a dead worker costs that one call, and the pool replaces the worker."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from rollout_executor.rewardpool import RewardCallError, RewardPool, RewardPoolStartError
from rollout_executor.rewards import RewardError, Scorer
from rollout_executor.samples import RewardInput, SampleKey

FIX = "tests.unit.reward_fixtures"


def sample(s: int) -> RewardInput:
    return RewardInput(key=SampleKey(0, 0, s), prompt="p", response="r")


async def wait_for(cond, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_sync_reward_runs_in_a_worker_and_the_loop_stays_free() -> None:
    pool = RewardPool(f"{FIX}:slow", workers=1, timeout_seconds=30)
    await pool.start()
    try:
        call = asyncio.ensure_future(pool.call(sample(0), {"seconds": 1.0}))
        ticks = 0
        while not call.done():  # the loop turns while the reward sleeps in its worker
            ticks += 1
            await asyncio.sleep(0.01)
        assert await call == 1.0
        assert ticks >= 10
    finally:
        await pool.close()


async def test_worker_pid_is_not_ours() -> None:
    pool = RewardPool(f"{FIX}:pid", workers=2, timeout_seconds=30)
    await pool.start()
    try:
        got = {await pool.call(sample(i), {}) for i in range(4)}
        assert os.getpid() not in got and got <= set(map(float, pool.pids))
    finally:
        await pool.close()


async def test_raise_hang_and_death_cost_one_call_and_the_worker_is_replaced() -> None:
    for fn, reason in (("flaky", "error"), ("hangs_on_sample_1", "timeout"), ("dies_on_sample_1", "worker_died")):
        pool = RewardPool(f"{FIX}:{fn}", workers=1, timeout_seconds=1.0)
        await pool.start()
        try:
            first = pool.pids
            assert await pool.call(sample(0), {}) == 0.5
            with pytest.raises(RewardCallError) as e:
                await pool.call(sample(1), {})
            assert e.value.reason == reason, fn
            assert await pool.call(sample(2), {}) == 0.5, "the pool goes on after the failure"
            if reason == "error":
                assert pool.pids == first and pool.replaced == 0
            else:
                assert pool.replaced == 1 and pool.pids != first
        finally:
            await pool.close()


async def test_a_worker_killed_between_calls_is_replaced() -> None:
    pool = RewardPool(f"{FIX}:pid", workers=1, timeout_seconds=5.0)
    await pool.start()
    try:
        (victim,) = pool.pids
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(RewardCallError) as e:
            await pool.call(sample(0), {})
        assert e.value.reason == "worker_died"
        await wait_for(lambda: len(pool.pids) == 1 and pool.pids != [victim])
        assert await pool.call(sample(1), {}) == float(pool.pids[0])
    finally:
        await pool.close()


async def test_unimportable_reward_fails_the_start_with_the_import_error() -> None:
    pool = RewardPool("no_such_module_xyz:fn", workers=1, timeout_seconds=5.0)
    with pytest.raises(RewardPoolStartError, match="no_such_module_xyz"):
        await pool.start()


async def test_scorer_names_function_sample_and_reason() -> None:
    scorer = Scorer(f"{FIX}:nan", {}, workers=1, timeout_seconds=5)
    await scorer.start()
    try:
        with pytest.raises(RewardError, match=rf"{FIX}:nan returned nan for rollout 0 group 0 sample 3") as e:
            await scorer(sample(3))
        assert e.value.reason == "not_a_number"
    finally:
        await scorer.close()
    hang = Scorer(f"{FIX}:async_hangs", {}, timeout_seconds=0.2)
    assert hang.pool is None, "an async reward runs on the loop"
    with pytest.raises(RewardError, match=r"timed out after 0\.2s") as e:
        await hang(sample(0))
    assert e.value.reason == "timeout"


def test_the_errors_that_reach_the_trainer_survive_pickling() -> None:
    """They cross Ray from the executor's actor to the trainer."""
    import pickle

    from rollout_executor.failures import FailureBudgetExceeded

    for e in (RewardError("reward f timed out", "timeout"), FailureBudgetExceeded("rollout 3: too many"),
              RewardCallError("its worker died", "worker_died")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e)
