"""Reward functions the reward-pool and executor tests import by name (the pool's workers import
them too): a plain module, not a test module, so importing it twice compiles nothing again."""

from __future__ import annotations

import os
import time

from rollout_executor.samples import RewardInput


def slow(sample: RewardInput, seconds: float = 1.0) -> float:
    time.sleep(seconds)
    return 1.0


def flaky(sample: RewardInput) -> float:
    if sample.key.sample == 1:
        raise ZeroDivisionError("boom")
    return 0.5


def hangs_on_sample_1(sample: RewardInput) -> float:
    if sample.key.sample == 1:
        time.sleep(3600)
    return 0.5


def dies_on_sample_1(sample: RewardInput) -> float:
    if sample.key.sample == 1:
        os._exit(3)
    return 0.5


def pid(sample: RewardInput) -> float:
    return float(os.getpid())


def nan(sample: RewardInput) -> float:
    return float("nan")


async def async_hangs(sample: RewardInput) -> float:
    import asyncio

    await asyncio.sleep(3600)
    return 0.0


def logged_sleep(sample: RewardInput, log: str, seconds: float = 1.0) -> float:
    """Sleeps like a slow judge; writes when it ran (CLOCK_MONOTONIC is one clock for every process)."""
    start = time.monotonic()
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(f"{start} {time.monotonic()}\n")
    return 1.0
