"""The rollout-function API's pure parts: sample validation, batches with loss masks, per-token
versions and metadata, the failure budget, and the calculator environment's tool."""

from __future__ import annotations

import numpy as np
import pytest
from rollout_executor.batching import build_batch, check_groups_complete
from rollout_executor.envs.calculator import calculate, score
from rollout_executor.failures import FailureBudgetExceeded, SampleFailure, allowed_failures, check_budget
from rollout_executor.rollout_api import MalformedSample, RolloutSample, check_sample
from rollout_executor.samples import Sample, SampleKey


def rs(**kw: object) -> RolloutSample:
    base: dict[str, object] = dict(prompt_token_ids=[1, 2], response_token_ids=[3, 4, 5], logprobs=[-1.0, -1.0, -1.0])
    base.update(kw)
    return RolloutSample(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "version", "what"), [
    ({"loss_mask": [1]}, 0, "loss_mask of 1 for 3 response tokens"),
    ({"logprobs": [-1.0]}, 0, "1 logprobs for 3 response tokens"),
    ({"weight_versions": [0, 0]}, 0, "weight_versions of 2 for 3 response tokens"),
    ({"prompt_token_ids": []}, 0, "no prompt_token_ids"),
    ({"reward": float("nan")}, 0, "reward nan is not finite"),
    ({"reward": "high"}, 0, "reward 'high' is not a number"),
    ({}, None, "no weight_versions and no engine call"),
])
def test_malformed_samples_say_what_is_wrong(kw: dict[str, object], version: int | None, what: str) -> None:
    with pytest.raises(MalformedSample, match=what):
        check_sample(rs(**kw), version)


def test_not_a_sample_is_malformed() -> None:
    with pytest.raises(MalformedSample, match="returned dict, not a RolloutSample"):
        check_sample({"prompt_token_ids": [1]}, 0)
    assert check_sample(rs(loss_mask=[1, 0, 1], reward=1), 3).loss_mask == [1, 0, 1]


def sample(g: int, s: int, **kw: object) -> Sample:
    base: dict[str, object] = dict(key=SampleKey(0, g, s), prompt_index=g, prompt="p", label=None, prompt_token_ids=[1, 2],
                                   response_token_ids=[3, 4, 5], response_logprobs=[-0.5, -0.5, -0.5], response="r",
                                   finish_reason="length", weight_version=2, engine="e", reward=float(s))
    base.update(kw)
    return Sample(**base)  # type: ignore[arg-type]


def test_a_single_turn_batch_has_no_new_fields() -> None:
    b = build_batch([sample(0, 0), sample(0, 1)], 0, 2)
    assert "token_weight_versions" not in b.arrays and "sample_metadata" not in b.meta
    assert b.response_mask.tolist() == [[0, 0, 1, 1, 1]] * 2


def test_loss_mask_token_versions_and_metadata_reach_the_batch() -> None:
    b = build_batch([sample(0, 0, loss_mask=[1, 0, 1], token_weight_versions=[2, 2, 3], metadata={"turns": 2}),
                     sample(0, 1)], 0, 2)
    assert b.response_mask.tolist() == [[0, 0, 1, 0, 1], [0, 0, 1, 1, 1]]
    assert b.token_weight_versions.tolist() == [[0, 0, 2, 2, 3], [0, 0, 2, 2, 2]]
    assert b.meta["sample_metadata"] == [{"turns": 2}, {}]


def test_dropped_samples_leave_their_group_short() -> None:
    check_groups_complete([sample(0, 0), sample(1, 0), sample(1, 1)], 2, 2, dropped=[(0, 1)])
    with pytest.raises(ValueError, match=r"group 0 has samples \[0\], expected 0..1"):
        check_groups_complete([sample(0, 0), sample(1, 0), sample(1, 1)], 2, 2)
    b = build_batch([sample(0, 0), sample(1, 0), sample(1, 1)], 0, 2)
    assert b.advantages[0] == 0.0 and np.isclose(b.advantages[1], -b.advantages[2])


def test_failure_budget_counts_failures_against_a_share_of_the_rollout() -> None:
    assert allowed_failures(0.25, 16) == 4 and allowed_failures(0.0, 16) == 0 and allowed_failures(1.0, 3) == 3
    f = {SampleKey(7, g, 0): SampleFailure(SampleKey(7, g, 0), g, "reward", "timeout", f"m{g}", False) for g in range(5)}
    check_budget(dict(list(f.items())[:4]), 0.25, 16, 7)
    with pytest.raises(FailureBudgetExceeded, match=r"rollout 7: 5 of 16 samples failed \(\{'reward/timeout': 5\}\).*first: m0"):
        check_budget(f, 0.25, 16, 7)


def test_calculator_tool_does_arithmetic_only() -> None:
    assert calculate("12 + 7") == "19" and calculate("3*(2-5)") == "-9" and calculate("7/2") == "3.5"
    assert calculate("1/0").startswith("error:")
    assert calculate("__import__('os').system('true')").startswith("error: not arithmetic")
    assert calculate("x + 1").startswith("error: not arithmetic")


def test_calculator_reward_pays_for_the_call_and_the_answer() -> None:
    assert score(False, [5], [5], 0.5) == 0.0
    assert score(True, [5, 6], [9], 0.5) == 1.0
    assert score(True, [5, 6], [6, 5, 1], 0.5) == 1.5
