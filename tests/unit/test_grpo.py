"""The reference trainer's loss: advantages, log-prob alignment, the sign of the gradient."""

from __future__ import annotations

import pytest
import torch
from rljob_client.trainer import grpo


def test_group_advantages_are_normalised_within_each_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 7.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = grpo.group_advantages(rewards, groups)
    for g in (0, 1):
        a = adv[groups == g]
        assert a.mean().abs() < 1e-6
        assert a.std(unbiased=False) == pytest.approx(1.0, abs=1e-4)
    assert adv[0] > 0 > adv[1]
    assert adv[5] > adv[4]


def test_group_with_equal_rewards_has_zero_advantage_not_nan() -> None:
    adv = grpo.group_advantages(torch.tensor([0.5, 0.5, 0.5, 1.0, 0.0]), torch.tensor([0, 0, 0, 1, 1]))
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[:3], torch.zeros(3))


def test_reinforce_uses_the_batch_mean_as_baseline() -> None:
    adv = grpo.advantages(torch.tensor([1.0, 0.0, 0.0, 3.0]), torch.tensor([0, 0, 1, 1]), "reinforce")
    assert torch.allclose(adv, torch.tensor([0.0, -1.0, -1.0, 2.0]))


def test_unknown_algorithm_is_rejected() -> None:
    with pytest.raises(ValueError, match="grpo or reinforce"):
        grpo.advantages(torch.tensor([1.0]), torch.tensor([0]), "ppo")  # type: ignore[arg-type]


def test_pack_marks_only_response_tokens_and_pads_right() -> None:
    b = grpo.pack([[1, 2], [3]], [[4, 5, 6], [7]], pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 4, 5, 6], [3, 7, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert b.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]


def test_token_logprobs_score_the_next_token() -> None:
    # logits at position t favour token (t + 1) strongly: log p of the real next token is ~0.
    ids = torch.tensor([[0, 1, 2, 3]])
    logits = torch.full((1, 4, 5), -20.0)
    for t in range(4):
        logits[0, t, (t + 1) % 5] = 20.0
    lp = grpo.token_logprobs(logits, ids)
    assert lp.shape == (1, 3)
    assert torch.allclose(lp, torch.zeros(1, 3), atol=1e-6)


def test_loss_gradient_raises_the_likelihood_of_positive_advantage_samples() -> None:
    torch.manual_seed(0)
    logits = torch.zeros(2, 3, 4, requires_grad=True)
    ids = torch.tensor([[0, 1, 2], [0, 3, 3]])
    batch_resp = torch.tensor([[0, 1, 1], [0, 1, 1]])
    adv = torch.tensor([1.0, -1.0])
    loss = grpo.policy_gradient_loss(grpo.token_logprobs(logits, ids), batch_resp, adv)
    loss.backward()
    step = logits.detach() - 0.5 * logits.grad
    after = grpo.token_logprobs(step, ids)
    before = grpo.token_logprobs(logits.detach(), ids)
    assert (after[0] > before[0]).all()  # sample with advantage +1 became likelier
    assert (after[1] < before[1]).all()  # sample with advantage -1 became less likely


def test_loss_ignores_prompt_and_padding_positions() -> None:
    ids = torch.tensor([[0, 1, 2, 0]])
    resp = torch.tensor([[0, 0, 1, 0]])
    base = torch.randn(1, 4, 3)
    changed = base.clone()
    changed[0, 0, 1] += 5.0  # position 0 predicts token 1 (a prompt token)
    changed[0, 2, 0] += 5.0  # position 2 predicts the padding token
    changed[0, 1, 0] -= 5.0  # position 1 predicts token 2 (the response): must count
    adv = torch.tensor([1.0])
    only_masked = base.clone()
    only_masked[0, 0, 1] += 5.0
    only_masked[0, 2, 0] += 5.0
    a = grpo.policy_gradient_loss(grpo.token_logprobs(base, ids), resp, adv)
    b = grpo.policy_gradient_loss(grpo.token_logprobs(only_masked, ids), resp, adv)
    c = grpo.policy_gradient_loss(grpo.token_logprobs(changed, ids), resp, adv)
    assert a.item() == pytest.approx(b.item())
    assert c.item() != pytest.approx(a.item())
