"""Reward functions: built-ins, the loader for `spec.rollout.reward.function`, and the Scorer.

A reward is `fn(sample: RewardInput, **args) -> float` (sync or async), named by an import
path `module:function`; `args` come from `spec.rollout.reward.args`. `score` wraps one call
so that a reward that raises, or returns something that is not a finite number, is a
RewardError naming the function and the sample, never a hang or a silent 0. The `Scorer`
runs each call where it cannot stall generation: an async reward on the event loop, a
synchronous one in a RewardPool worker process (the built-ins here, pure and fast, inline),
each bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
from rljob_client.errors import RLJobError

from rollout_executor.rewardpool import RewardCallError, RewardPool, RewardPoolStartError
from rollout_executor.samples import RewardInput, VocabInfo

RewardFn = Callable[..., Any]


class RewardError(RLJobError):
    """The reward function failed for a sample; the message names both. `reason`: error,
    timeout, worker_died or not_a_number (the label of the failure metric)."""

    def __init__(self, message: str, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


def load_reward(path: str, field: str = "spec.rollout.reward.function") -> RewardFn:
    """Import `module:function`; a clear error names the spec field (and carries the import error)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"{field} {path!r}: expected 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RewardError(f"{field} {path!r}: cannot import {module_name!r}: {e}") from e
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise RewardError(f"{field} {path!r}: {module_name} has no function {attr!r}")
    return fn


async def score(fn: RewardFn, name: str, sample: RewardInput, args: dict[str, Any]) -> float:
    try:
        value = fn(sample, **args)
        if inspect.isawaitable(value):
            value = await value
    except Exception as e:
        raise RewardError(f"reward function {name} raised {type(e).__name__}: {e} for {sample.key} (prompt {sample.prompt[:80]!r})") from e
    return as_reward(value, name, sample)


def as_reward(value: Any, name: str, sample: RewardInput) -> float:
    """The value as a finite float, or a RewardError (reason not_a_number) naming both."""
    try:
        out = float(value)
    except (TypeError, ValueError) as e:
        raise RewardError(f"reward function {name} returned {value!r}, not a number, for {sample.key}", "not_a_number") from e
    if not math.isfinite(out):
        raise RewardError(f"reward function {name} returned {out} for {sample.key} (prompt {sample.prompt[:80]!r}); rewards must be finite", "not_a_number")
    return out


BUILTIN_PREFIX = "rollout_executor.rewards:"


class Scorer:
    """One reward function, called so that it never stalls generation, each call bounded in time."""

    def __init__(self, name: str, args: dict[str, Any], workers: int = 2, timeout_seconds: float = 60.0,
                 fn: RewardFn | None = None) -> None:
        self.name = name
        self.fn = fn if fn is not None else load_reward(name)
        self.args = args
        self.timeout_seconds = timeout_seconds
        self.is_async = inspect.iscoroutinefunction(self.fn)
        self.inline = self.is_async or name.startswith(BUILTIN_PREFIX) or fn is not None
        self.pool: RewardPool | None = None if self.inline else RewardPool(name, workers, timeout_seconds)

    async def start(self) -> None:
        if self.pool is not None:
            try:
                await self.pool.start()
            except RewardPoolStartError as e:
                raise RewardError(f"spec.rollout.reward.function {self.name!r}: {e}") from e

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def __call__(self, sample: RewardInput) -> float:
        if self.pool is None:
            if not self.is_async:
                return await score(self.fn, self.name, sample, self.args)
            try:
                return await asyncio.wait_for(score(self.fn, self.name, sample, self.args), self.timeout_seconds)
            except TimeoutError:
                raise RewardError(f"reward function {self.name} timed out after {self.timeout_seconds:g}s for {sample.key}", "timeout") from None
        try:
            value = await self.pool.call(sample, self.args)
        except RewardCallError as e:
            raise RewardError(f"reward function {self.name} {e} for {sample.key} (prompt {sample.prompt[:80]!r})", e.reason) from e
        return as_reward(value, self.name, sample)


# ---- built-ins -----------------------------------------------------------------------------

# pass@1 counts a sample as solved when its reward reaches its reward's success threshold
# (spec.rollout.eval.successThreshold overrides it). The binary built-ins score 1.0 for a
# correct answer; the token-set toy has no "correct", so a pass there is a response at least
# half of whose tokens lie in the set (base rate 0.10). A custom reward: 1.0, the usual top score.
DEFAULT_SUCCESS_THRESHOLD = 1.0
SUCCESS_THRESHOLDS = {
    "rollout_executor.rewards:exact_match": 1.0,
    "rollout_executor.rewards:regex_match": 1.0,
    "rollout_executor.rewards:math_answer": 1.0,
    "rollout_executor.rewards:token_set_fraction": 0.5,
}


def success_threshold(function: str, override: float | None = None) -> float:
    """The reward at or above which a sample of `function` counts as a pass for pass@1."""
    if override is not None:
        return override
    return SUCCESS_THRESHOLDS.get(function, DEFAULT_SUCCESS_THRESHOLD)



def exact_match(sample: RewardInput, strip: bool = True, case_sensitive: bool = True) -> float:
    """1.0 when the response equals the label."""
    if sample.label is None:
        return 0.0
    a, b = sample.response, str(sample.label)
    if strip:
        a, b = a.strip(), b.strip()
    if not case_sensitive:
        a, b = a.lower(), b.lower()
    return 1.0 if a == b else 0.0


def regex_match(sample: RewardInput, pattern: str | None = None, flags: str = "") -> float:
    """1.0 when `pattern` (or the label, read as a regex) is found in the response."""
    pat = pattern if pattern is not None else (str(sample.label) if sample.label is not None else None)
    if pat is None:
        return 0.0
    fl = 0
    for c in flags:
        fl |= {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}[c]
    return 1.0 if re.search(pat, sample.response, fl) else 0.0


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def extract_answer(text: str) -> float | None:
    """The last \\boxed{...} if there is one, else the last number in the text."""
    boxed = _BOXED.findall(text)
    candidates = [boxed[-1]] if boxed else []
    candidates.append(text)
    for c in candidates:
        nums = _NUMBER.findall(c)
        if nums:
            try:
                return float(nums[-1].replace(",", ""))
            except ValueError:
                continue
    return None


def math_answer(sample: RewardInput, tolerance: float = 1e-6) -> float:
    """1.0 when the response's final answer equals the label numerically."""
    if sample.label is None:
        return 0.0
    got = extract_answer(sample.response)
    want = extract_answer(str(sample.label))
    if got is None or want is None:
        return 0.0
    return 1.0 if abs(got - want) <= tolerance * max(1.0, abs(want)) else 0.0


@lru_cache(maxsize=16)
def token_set(vocab_size: int, special_ids: frozenset[int], size: int, seed: int) -> frozenset[int]:
    """A fixed random set of `size` non-special token ids drawn with `seed`."""
    candidates = np.array([i for i in range(vocab_size) if i not in special_ids], dtype=np.int64)
    if size > len(candidates):
        raise ValueError(f"token set of {size} ids asked from {len(candidates)} non-special ids")
    rng = np.random.default_rng(seed)
    return frozenset(int(i) for i in rng.choice(candidates, size=size, replace=False))


def token_set_fraction(sample: RewardInput, size: int = 100, seed: int = 0, vocab_size: int | None = None) -> float:
    """The demo reward: fraction of generated token ids inside a fixed random id set.

    Base rate size / non-special vocab (0.10 for the tiny model); learnable by a tiny model in
    a few dozen GRPO steps, and it cannot be reward-hacked by stopping early (an empty answer
    scores 0).
    """
    vocab = sample.vocab
    if vocab is None:
        if vocab_size is None:
            raise ValueError("token_set_fraction needs the tokenizer's vocab (model dir with config.json) or vocab_size=")
        vocab = VocabInfo(vocab_size=vocab_size)
    ids = sample.response_token_ids
    if not ids:
        return 0.0
    chosen = token_set(vocab.vocab_size, vocab.special_ids, size, seed)
    return sum(1 for t in ids if t in chosen) / len(ids)
