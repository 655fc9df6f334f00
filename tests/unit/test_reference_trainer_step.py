"""The reference trainer's step: micro-batches accumulate the whole batch's gradient; the KL term (k3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rljob_client.trainer import grpo
from rljob_client.trainer.policy import PolicyTrainer

from tests.unit.test_offpolicy import batch_sampled_at, tiny_model_dir  # noqa: F401  (the fixture)


def gradients(policy: PolicyTrainer, model_dir: Path) -> dict[str, torch.Tensor]:
    policy.optimizer.zero_grad(set_to_none=True)
    policy.accumulate_gradients(batch_sampled_at(model_dir, 1.0))
    return {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("micro", [1, 3])
def test_micro_batches_accumulate_the_gradient_of_the_whole_batch(tiny_model_dir: Path, micro: int) -> None:  # noqa: F811
    whole = gradients(PolicyTrainer(tiny_model_dir, 1e-3, kl_coef=0.5), tiny_model_dir)
    split = PolicyTrainer(tiny_model_dir, 1e-3, micro_batch_size=micro, kl_coef=0.5)
    assert [(s.start, s.stop) for s in split.micro_batches(4)] == ([(0, 1), (1, 2), (2, 3), (3, 4)] if micro == 1
                                                                   else [(0, 3), (3, 4)])
    parts = gradients(split, tiny_model_dir)
    assert whole.keys() == parts.keys() and whole
    for name in whole:
        torch.testing.assert_close(parts[name], whole[name], rtol=1e-4, atol=1e-6, msg=name)


def test_k3_is_zero_at_the_reference_and_positive_elsewhere_only_on_response_tokens() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    mask = torch.tensor([[0, 0, 1, 1]])  # [B, T]: the first position is shifted away
    assert grpo.kl_k3(logp, logp.clone(), mask).item() == pytest.approx(0.0)
    ref = torch.log(torch.tensor([[0.9, 0.5, 0.2]]))
    delta = (ref - logp)[0, 1:]
    expected = float((torch.exp(delta) - delta - 1).mean())
    assert grpo.kl_k3(logp, ref, mask).item() == pytest.approx(expected)
    assert grpo.kl_k3(logp, ref, mask).item() > 0
    other = ref.clone()
    other[0, 0] = 0.0  # a prompt position: not in the mask, changes nothing
    assert grpo.kl_k3(logp, other, mask).item() == pytest.approx(expected)


def test_the_kl_term_pulls_a_drifted_policy_back_to_the_reference(tiny_model_dir: Path) -> None:  # noqa: F811
    policy = PolicyTrainer(tiny_model_dir, 1e-3, kl_coef=1.0)
    assert policy.reference is not None and not any(p.requires_grad for p in policy.reference.parameters())
    assert PolicyTrainer(tiny_model_dir, 1e-3).reference is None  # klCoef 0: no reference model is loaded
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = batch_sampled_at(tiny_model_dir, 1.0)
    batch.arrays["rewards"][:] = 1.0  # equal rewards: zero advantage, only the KL term has a gradient
    policy.optimizer.zero_grad(set_to_none=True)
    _, _, kl_before = policy.accumulate_gradients(batch)
    assert kl_before > 0
    for _ in range(5):
        policy.train_step(batch)
    policy.optimizer.zero_grad(set_to_none=True)
    _, _, kl_after = policy.accumulate_gradients(batch)
    assert kl_after < kl_before
