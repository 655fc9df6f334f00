"""Reward built-ins and the guard that turns a failing reward into a clear error."""

from __future__ import annotations

import math

import pytest
from rollout_executor.rewards import (
    RewardError,
    exact_match,
    extract_answer,
    load_reward,
    math_answer,
    regex_match,
    score,
    token_set,
    token_set_fraction,
)
from rollout_executor.samples import RewardInput, SampleKey, VocabInfo

KEY = SampleKey(3, 1, 2)


def sample(response: str = "", label: object = None, ids: tuple[int, ...] = (), vocab: VocabInfo | None = None) -> RewardInput:
    return RewardInput(key=KEY, prompt="what?", response=response, label=label, response_token_ids=ids, vocab=vocab)


def test_exact_and_regex_match() -> None:
    assert exact_match(sample(" 42 ", "42")) == 1.0
    assert exact_match(sample("41", "42")) == 0.0
    assert exact_match(sample("Yes", "yes"), case_sensitive=False) == 1.0
    assert regex_match(sample("the answer is 42.", r"answer is \d+")) == 1.0
    assert regex_match(sample("no digits"), pattern=r"\d") == 0.0


@pytest.mark.parametrize(
    ("text", "want"),
    [("so 3 + 4 = 7", 7.0), (r"first 1 then \boxed{12.5} and 99", 12.5), ("1,234 apples", 1234.0), ("none", None), ("-3", -3.0)],
)
def test_extract_answer(text: str, want: float | None) -> None:
    assert extract_answer(text) == want


def test_math_answer_compares_numerically() -> None:
    assert math_answer(sample("The result is 8.0", "8")) == 1.0
    assert math_answer(sample(r"\boxed{7}", "8")) == 0.0
    assert math_answer(sample("no number", "8")) == 0.0


def test_token_set_fraction_counts_ids_in_the_fixed_set() -> None:
    vocab = VocabInfo(vocab_size=1000, special_ids=frozenset({0, 1, 2}))
    chosen = token_set(1000, vocab.special_ids, 100, 0)
    assert len(chosen) == 100 and not chosen & vocab.special_ids
    assert token_set(1000, vocab.special_ids, 100, 0) == chosen
    assert token_set(1000, vocab.special_ids, 100, 1) != chosen
    inside = sorted(chosen)[:3]
    outside = [i for i in range(3, 1000) if i not in chosen][:1]
    assert token_set_fraction(sample(ids=(*inside, *outside), vocab=vocab)) == pytest.approx(0.75)
    assert token_set_fraction(sample(ids=(), vocab=vocab)) == 0.0


def test_load_reward_resolves_and_names_bad_paths() -> None:
    assert load_reward("rollout_executor.rewards:math_answer") is math_answer
    with pytest.raises(RewardError, match="cannot import"):
        load_reward("no_such_module_xyz:f")
    with pytest.raises(RewardError, match="has no function"):
        load_reward("rollout_executor.rewards:nope")
    with pytest.raises(RewardError, match="module:function"):
        load_reward("rollout_executor.rewards")


async def test_score_raising_reward_names_function_and_sample() -> None:
    def boom(s: RewardInput) -> float:
        raise KeyError("label")

    with pytest.raises(RewardError, match=r"reward function my\.mod:boom raised KeyError.*rollout 3 group 1 sample 2"):
        await score(boom, "my.mod:boom", sample("x"), {})


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "high", None])
async def test_score_rejects_non_finite_or_non_numbers(bad: object) -> None:
    with pytest.raises(RewardError, match=r"reward function f returned .* rollout 3 group 1 sample 2"):
        await score(lambda s: bad, "f", sample("x"), {})


async def test_score_awaits_async_rewards_and_passes_args() -> None:
    async def scaled(s: RewardInput, factor: float) -> float:
        return factor * len(s.response)

    assert await score(scaled, "scaled", sample("abc"), {"factor": 2.0}) == 6.0
