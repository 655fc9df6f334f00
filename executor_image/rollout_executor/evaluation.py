"""Evaluation on the frozen eval fleet, given as plain data (`EvalFleetResponse`).

The executor never sees controller state: it asks a provider (the controller API's
`eval_fleet` verb in a cluster) for endpoints plus the pinned version, and skips with a
reason when it cannot evaluate on the right weights: `not_configured` (no eval fleet),
`controller_unreachable` (the provider failed), `pin_violation` / `unhealthy` (as the
controller reports them). Greedy decoding, one sample per prompt, the training reward.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from controller_runtime.api.control import EvalFleetResponse
from rollout_executor.dataset import Prompt
from rollout_executor.generation import (
    EnginePool,
    Generator,
    SamplingParams,
    WeightGate,
    static_endpoints,
)
from rollout_executor.rewards import RewardFn, score
from rollout_executor.samples import RewardInput, SampleKey, VocabInfo

log = logging.getLogger(__name__)

EvalFleetProvider = Callable[[], Awaitable[EvalFleetResponse]]
EVAL_SKIP_REASONS = ("pin_violation", "unhealthy", "controller_unreachable", "not_configured")


def skipped(rollout_id: int, reason: str, detail: str = "") -> dict[str, Any]:
    return {"rollout_id": rollout_id, "skipped": True, "reason": reason, "detail": detail}


async def run_eval(
    rollout_id: int,
    fleet_provider: EvalFleetProvider | None,
    prompts: list[Prompt],
    session: aiohttp.ClientSession,
    reward_fn: RewardFn,
    reward_name: str,
    reward_args: dict[str, Any],
    vocab: VocabInfo | None,
    max_tokens: int,
    model: str | None = None,
    concurrency: int = 16,
) -> dict[str, Any]:
    if fleet_provider is None:
        return skipped(rollout_id, "not_configured", "no eval fleet provider (spec.inference.eval is unset)")
    try:
        fleet = await fleet_provider()
    except Exception as e:
        return skipped(rollout_id, "controller_unreachable", f"{type(e).__name__}: {e}")
    if not fleet.ok:
        reason = fleet.skip_reason if fleet.skip_reason in EVAL_SKIP_REASONS else "unhealthy"
        return skipped(rollout_id, reason, fleet.skip_reason or "eval fleet not ready")
    if not fleet.endpoints:
        return skipped(rollout_id, "unhealthy", "eval fleet reported ok but has no endpoints")
    pool = EnginePool(static_endpoints(fleet.endpoints), concurrency=concurrency, no_engine_timeout_seconds=60)
    gen = Generator(pool, WeightGate(), SamplingParams(max_tokens=max_tokens, temperature=0.0), session, model=model, max_attempts=5)

    async def one(i: int, p: Prompt) -> float:
        key = SampleKey(rollout_id, i, 0)
        c = await gen.complete(key, p.text)
        ri = RewardInput(
            key=key,
            prompt=p.text,
            response=c.text,
            label=p.label,
            prompt_token_ids=tuple(c.prompt_token_ids),
            response_token_ids=tuple(c.token_ids),
            finish_reason=c.finish_reason,
            vocab=vocab,
            record=p.record,
        )
        return await score(reward_fn, reward_name, ri, reward_args)

    rewards = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return {
        "rollout_id": rollout_id,
        "skipped": False,
        "reason": None,
        "weight_version": fleet.pinned_version,
        "checkpoint": fleet.checkpoint,
        "n": len(rewards),
        "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "rewards": list(rewards),
    }
