"""Evaluation of the policy: mean reward and pass@1 on an eval set, on the eval fleet or the policy fleet.

Two places to generate:
- the eval fleet (spec.inference.eval), given as plain data (`EvalFleetResponse`) by a
  provider (the controller API's `eval_fleet` verb in a cluster). An eval point of the policy
  being trained asks the provider to re-pin the fleet to the step's exported weights first
  (miles V2 pins per eval point). The executor never sees controller state, and it skips
  with a reason when it cannot evaluate on the right weights: `not_configured` (no eval
  fleet), `controller_unreachable` (the provider failed), `pin_violation` / `unhealthy` (as
  the controller reports them);
- the policy fleet (no eval fleet, spec.rollout.eval set): the executor's own engines, between
  the step's weight update and the next rollout; samples carry the version they ran under.

pass@1 is the unbiased estimator with k = 1 (Chen et al. 2021): per prompt, the fraction of
its samples whose reward reaches the success threshold (`rewards.success_threshold`), averaged
over prompts; with the same number of samples per prompt that is the fraction of passing
samples. Greedy decoding with one sample per prompt is the default.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from controller_runtime.api.control import EvalFleetResponse, RecordEvalRequest
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

# Called with no arguments: the spec's pinned checkpoint; with (checkpoint, weight_version): re-pin first.
EvalFleetProvider = Callable[..., Awaitable[EvalFleetResponse]]
EvalRecorder = Callable[[RecordEvalRequest], Awaitable[Any]]  # status.lastEval, through the controller API
EVAL_SKIP_REASONS = ("pin_violation", "unhealthy", "controller_unreachable", "not_configured")
POLICY_FLEET, EVAL_FLEET = "policy", "eval"


@dataclass(frozen=True)
class EvalMetrics:
    mean_reward: float
    pass_at_1: float
    samples: int
    prompts: int


def eval_metrics(rewards: Sequence[Sequence[float]], threshold: float) -> EvalMetrics:
    """Mean reward over every sample, and pass@1 (per prompt: passing samples / samples, averaged).

    `rewards` holds each prompt's sample rewards; a prompt without samples counts for nothing.
    No samples at all: both are 0.0 with `samples == 0`, so nobody reads a score into it.
    """
    groups = [list(g) for g in rewards if len(g)]
    flat = [r for g in groups for r in g]
    if not flat:
        return EvalMetrics(0.0, 0.0, 0, 0)
    passed = sum(sum(1 for r in g if r >= threshold) / len(g) for g in groups) / len(groups)
    return EvalMetrics(sum(flat) / len(flat), passed, len(flat), len(groups))


@dataclass(frozen=True)
class EvalTask:
    """What one evaluation scores: prompts, how many samples each and how, and what passes."""

    prompts: list[Prompt]
    sampling: SamplingParams
    samples_per_prompt: int
    threshold: float
    reward_fn: RewardFn
    reward_name: str
    reward_args: dict[str, Any]
    vocab: VocabInfo | None
    scorer: Callable[[RewardInput], Awaitable[float]] | None = None  # the executor's (worker pool, timeout)
    render: Callable[[list[dict[str, Any]]], list[int]] | None = None  # chat rows: the chat template's token ids


def skipped(rollout_id: int, reason: str, detail: str = "") -> dict[str, Any]:
    return {"rollout_id": rollout_id, "skipped": True, "reason": reason, "detail": detail}


async def score_prompts(rollout_id: int, gen: Generator, task: EvalTask) -> tuple[list[list[float]], list[int]]:
    """Every prompt's sample rewards, and the weight versions the samples ran under."""

    async def one(i: int, s: int, p: Prompt) -> tuple[float, int]:
        key = SampleKey(rollout_id, i, s)
        prompt: str | list[int] = p.text if p.messages is None or task.render is None else task.render(p.messages)
        c = await gen.complete(key, prompt, task.sampling)
        ri = RewardInput(
            key=key,
            prompt=p.text,
            response=c.text,
            label=p.label,
            prompt_token_ids=tuple(c.prompt_token_ids),
            response_token_ids=tuple(c.token_ids),
            finish_reason=c.finish_reason,
            vocab=task.vocab,
            record=p.record,
        )
        if task.scorer is not None:
            return await task.scorer(ri), c.weight_version
        return await score(task.reward_fn, task.reward_name, ri, task.reward_args), c.weight_version

    n = task.samples_per_prompt
    results = await asyncio.gather(*(one(i, s, p) for i, p in enumerate(task.prompts) for s in range(n)))
    rewards = [[r for r, _ in results[i * n:(i + 1) * n]] for i in range(len(task.prompts))]
    return rewards, sorted({v for _, v in results})


def result(rollout_id: int, task: EvalTask, rewards: list[list[float]], fleet: str, weight_version: str | None,
           started: float, **extra: Any) -> dict[str, Any]:
    m = eval_metrics(rewards, task.threshold)
    return {
        "rollout_id": rollout_id,
        "skipped": False,
        "reason": None,
        "fleet": fleet,
        "weight_version": weight_version,
        "n": m.samples,
        "prompts": m.prompts,
        "samples_per_prompt": task.samples_per_prompt,
        "mean_reward": m.mean_reward,
        "pass_at_1": m.pass_at_1,
        "success_threshold": task.threshold,
        "rewards": [r for g in rewards for r in g],
        "seconds": time.monotonic() - started,
        **extra,
    }


async def eval_on_policy_fleet(rollout_id: int, gen: Generator, task: EvalTask) -> dict[str, Any]:
    """On the executor's own engines (through its weight gate: never across a weight update)."""
    started = time.monotonic()
    rewards, versions = await score_prompts(rollout_id, gen, task)
    version = str(versions[-1]) if versions else None
    return result(rollout_id, task, rewards, POLICY_FLEET, version, started, weight_versions=versions)


async def run_eval(
    rollout_id: int,
    fleet_provider: EvalFleetProvider | None,
    task: EvalTask,
    session: aiohttp.ClientSession,
    model: str | None = None,
    concurrency: int = 16,
    checkpoint: str | None = None,
    weight_version: str | None = None,
) -> dict[str, Any]:
    """On the eval fleet: pinned to the spec's checkpoint, or first re-pinned to `checkpoint`."""
    started = time.monotonic()
    if fleet_provider is None:
        return skipped(rollout_id, "not_configured", "no eval fleet provider (spec.inference.eval is unset)")
    try:
        repin = checkpoint is not None or weight_version is not None
        fleet = await (fleet_provider(checkpoint, weight_version) if repin else fleet_provider())
    except Exception as e:
        return skipped(rollout_id, "controller_unreachable", f"{type(e).__name__}: {e}")
    if not fleet.ok:
        reason = fleet.skip_reason if fleet.skip_reason in EVAL_SKIP_REASONS else "unhealthy"
        return skipped(rollout_id, reason, fleet.message or fleet.skip_reason or "eval fleet not ready")
    if not fleet.endpoints:
        return skipped(rollout_id, "unhealthy", "eval fleet reported ok but has no endpoints")
    pool = EnginePool(static_endpoints(fleet.endpoints), concurrency=concurrency, no_engine_timeout_seconds=60)
    gen = Generator(pool, WeightGate(), task.sampling, session, model=model, max_attempts=5)
    rewards, _ = await score_prompts(rollout_id, gen, task)
    return result(rollout_id, task, rewards, EVAL_FLEET, fleet.pinned_version, started, checkpoint=fleet.checkpoint)


POINT_KEYS = ("rollout_id", "skipped", "reason", "fleet", "weight_version", "mean_reward", "pass_at_1", "n",
              "prompts", "samples_per_prompt", "seconds")


def eval_point(out: dict[str, Any]) -> dict[str, Any]:
    """An eval result without its per-sample rewards: what stats and summaries keep."""
    return {k: out[k] for k in POINT_KEYS if k in out}


def record_request(out: dict[str, Any]) -> RecordEvalRequest:
    """An eval result as status.lastEval's request."""
    version = out.get("weight_version")
    return RecordEvalRequest(step=int(out["rollout_id"]), weight_version=None if version is None else str(version),
                             reward=float(out["mean_reward"]), pass_at_1=float(out["pass_at_1"]),
                             samples=int(out["n"]), fleet=str(out.get("fleet", POLICY_FLEET)))
