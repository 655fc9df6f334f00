"""Off-policy correction and temperature in the reference trainer, on hand-computed tensors.

One token per sample keeps the algebra checkable by hand: for logits z scoring token y,
d log softmax(z)[y] / dz = onehot(y) - softmax(z). With loss = -w * A * log p (TIS, w
detached) the gradient is -w * A * (onehot - p); with the PPO surrogate loss = -r * A it is
-r * A * (onehot - p) while the ratio is inside the clip, and exactly 0 beyond it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from rljob_client.trainer import grpo
from rljob_client.wire.trainbatch import TrainBatch

from controller_runtime.api.spec import (
    STALE_NEEDS_CORRECTION_MSG,
    OffPolicyMode,
    OffPolicySpec,
    RLJobSpec,
)

Z = torch.tensor([0.3, -1.0, 0.8])  # logits of the one scored position
Y = 2  # the sampled token
CLIP = grpo.OffPolicyCorrection(OffPolicyMode.clip, clip_eps_low=0.2, clip_eps_high=0.2)
TIS = grpo.OffPolicyCorrection(OffPolicyMode.tis, tis_cap=2.0)
NONE = grpo.OffPolicyCorrection(OffPolicyMode.none)


def one_token(ratio: float, advantage: float, correction: grpo.OffPolicyCorrection,
              temperature: float = 1.0) -> tuple[grpo.PolicyLoss, torch.Tensor]:
    """Loss and d loss / d z for one sample [prompt 0, response Y] whose engine logprob gives `ratio`."""
    logits = torch.zeros(1, 2, 3)
    logits[0, 0] = Z
    logits.requires_grad_(True)
    ids = torch.tensor([[0, Y]])
    lp = grpo.token_logprobs(logits, ids, temperature)
    behaviour = torch.zeros(1, 2)
    behaviour[0, 1] = lp.detach()[0, 0] - math.log(ratio)
    out = grpo.corrected_policy_loss(lp, behaviour, torch.tensor([[0, 1]]), torch.tensor([advantage]), correction)
    out.loss.backward()
    assert logits.grad is not None
    return out, logits.grad[0, 0]


def score_gradient() -> torch.Tensor:
    """d log softmax(Z)[Y] / dZ, by the formula."""
    return torch.nn.functional.one_hot(torch.tensor(Y), 3).float() - torch.softmax(Z, -1)


def batch_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    logits = torch.randn(3, 5, 7)
    ids = torch.randint(0, 7, (3, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 1, 1]])
    adv = torch.tensor([1.5, -0.5, -1.0])
    return logits, ids, mask, adv


def todays_loss_and_grad(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                         adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.clone().requires_grad_(True)
    loss = grpo.policy_gradient_loss(grpo.token_logprobs(x, ids), mask, adv)
    loss.backward()
    assert x.grad is not None
    return loss.detach(), x.grad


def corrected_loss_and_grad(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor,
                            correction: grpo.OffPolicyCorrection) -> tuple[grpo.PolicyLoss, torch.Tensor]:
    """With behaviour logprobs equal to the trainer's own: ratio 1 on every response token."""
    x = logits.clone().requires_grad_(True)
    lp = grpo.token_logprobs(x, ids)
    behaviour = torch.zeros(ids.shape)
    behaviour[:, 1:] = lp.detach() * mask[:, 1:]  # as the batch has it: 0 outside the response
    out = grpo.corrected_policy_loss(lp, behaviour, mask, adv, correction)
    out.loss.backward()
    assert x.grad is not None
    return out, x.grad


@pytest.mark.parametrize("correction", [NONE, TIS], ids=["none", "tis"])
def test_ratio_one_gives_todays_loss_and_gradient(correction: grpo.OffPolicyCorrection) -> None:
    logits, ids, mask, adv = batch_inputs()
    loss, grad = todays_loss_and_grad(logits, ids, mask, adv)
    out, got = corrected_loss_and_grad(logits, ids, mask, adv, correction)
    assert out.loss.item() == pytest.approx(loss.item(), abs=1e-7)
    assert torch.allclose(got, grad, atol=1e-7)
    assert out.ratio_mean == pytest.approx(1.0)
    assert out.clipped_fraction == 0.0


def test_ratio_one_clip_has_todays_gradient_and_the_surrogates_value() -> None:
    """PPO's surrogate is r * A, so on-policy its value is -mean(A), its gradient today's."""
    logits, ids, mask, adv = batch_inputs()
    _, grad = todays_loss_and_grad(logits, ids, mask, adv)
    out, got = corrected_loss_and_grad(logits, ids, mask, adv, CLIP)
    assert torch.allclose(got, grad, atol=1e-7)
    assert out.loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert out.clipped_fraction == 0.0


@pytest.mark.parametrize(("ratio", "advantage"), [(1.5, 1.0), (0.5, -1.0)], ids=["above-high", "below-low"])
def test_a_token_beyond_the_clip_in_its_advantages_direction_has_no_gradient(ratio: float, advantage: float) -> None:
    out, grad = one_token(ratio, advantage, CLIP)
    assert torch.equal(grad, torch.zeros(3))
    clipped = 1.2 if ratio > 1 else 0.8
    assert out.loss.item() == pytest.approx(-clipped * advantage)  # min(r A, clip(r) A) picks the clipped value
    assert out.clipped_fraction == 1.0


@pytest.mark.parametrize(("ratio", "advantage"), [(1.5, -1.0), (0.5, 1.0), (1.1, 1.0), (0.9, -1.0)],
                         ids=["above-negative", "below-positive", "inside-positive", "inside-negative"])
def test_a_token_the_clip_does_not_bind_has_the_ratio_weighted_gradient(ratio: float, advantage: float) -> None:
    """min() keeps the unclipped term: the pessimistic side of the clip still pushes back."""
    out, grad = one_token(ratio, advantage, CLIP)
    assert torch.allclose(grad, -ratio * advantage * score_gradient(), atol=1e-6)
    assert out.loss.item() == pytest.approx(-ratio * advantage)
    assert out.clipped_fraction == 0.0


def test_clip_bounds_are_configurable_low_and_high_apart() -> None:
    wide_high = grpo.OffPolicyCorrection(OffPolicyMode.clip, clip_eps_low=0.2, clip_eps_high=0.6)
    _, grad = one_token(1.5, 1.0, wide_high)  # 1.5 < 1 + 0.6: not clipped any more
    assert torch.allclose(grad, -1.5 * score_gradient(), atol=1e-6)
    tight_low = grpo.OffPolicyCorrection(OffPolicyMode.clip, clip_eps_low=0.05, clip_eps_high=0.6)
    _, grad = one_token(0.9, -1.0, tight_low)  # 0.9 < 1 - 0.05: clipped now
    assert torch.equal(grad, torch.zeros(3))


@pytest.mark.parametrize(("ratio", "weight"), [(3.0, 2.0), (2.0, 2.0), (0.5, 0.5), (1.25, 1.25)])
@pytest.mark.parametrize("advantage", [1.0, -0.7])
def test_tis_weight_is_the_capped_ratio_and_carries_no_gradient(ratio: float, weight: float, advantage: float) -> None:
    out, grad = one_token(ratio, advantage, TIS)
    # A weight that carried gradient would add -A * w * log p * (onehot - p) to this.
    assert torch.allclose(grad, -weight * advantage * score_gradient(), atol=1e-6)
    log_p = torch.log_softmax(Z, -1)[Y].item()
    assert out.loss.item() == pytest.approx(-weight * advantage * log_p, rel=1e-6)
    assert out.clipped_fraction == (1.0 if ratio > 2.0 else 0.0)
    assert out.ratio_mean == pytest.approx(ratio, rel=1e-5)


def test_a_token_the_engine_all_but_excluded_gives_a_finite_gradient() -> None:
    """An engine logprob of -1e4 would make r = inf and the discarded branch's gradient NaN."""
    for correction in (CLIP, TIS):
        logits = torch.zeros(1, 2, 3, requires_grad=True)
        lp = grpo.token_logprobs(logits, torch.tensor([[0, 1]]))
        out = grpo.corrected_policy_loss(lp, torch.tensor([[0.0, -1e4]]), torch.tensor([[0, 1]]),
                                         torch.tensor([1.0]), correction)
        out.loss.backward()
        assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_positions_outside_the_response_do_not_count_in_any_mode() -> None:
    logits, ids, mask, adv = batch_inputs()
    for correction in (NONE, CLIP, TIS):
        x = logits.clone().requires_grad_(True)
        lp = grpo.token_logprobs(x, ids)
        garbage = torch.full(ids.shape, 50.0)  # nonsense where mask is 0: must be ignored
        behaviour = torch.where(mask > 0, torch.nn.functional.pad(lp.detach(), (1, 0)), garbage)
        out = grpo.corrected_policy_loss(lp, behaviour, mask, adv, correction)
        assert out.ratio_mean == pytest.approx(1.0)
        assert out.clipped_fraction == 0.0


def test_temperature_scores_softmax_of_logits_over_t() -> None:
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])
    ids = torch.tensor([[0, 2]])
    # softmax([1, 2, 3] / 2) at token 2: 1.5 - log(e^0.5 + e^1 + e^1.5)
    by_hand = 1.5 - math.log(math.exp(0.5) + math.exp(1.0) + math.exp(1.5))
    assert grpo.token_logprobs(logits, ids, temperature=2.0).item() == pytest.approx(by_hand, abs=1e-6)
    # T = 0.5 sharpens: 6 - log(e^2 + e^4 + e^6)
    sharp = 6.0 - math.log(math.exp(2.0) + math.exp(4.0) + math.exp(6.0))
    assert grpo.token_logprobs(logits, ids, temperature=0.5).item() == pytest.approx(sharp, abs=1e-6)
    unscaled = 3.0 - math.log(math.exp(1.0) + math.exp(2.0) + math.exp(3.0))
    assert grpo.token_logprobs(logits, ids).item() == pytest.approx(unscaled, abs=1e-6)
    assert grpo.token_logprobs(logits, ids, temperature=0.0).item() == pytest.approx(unscaled, abs=1e-6)  # greedy


def test_temperature_scales_the_gradient_by_one_over_t() -> None:
    """d log softmax(z/T)[y] / dz = (onehot - softmax(z/T)) / T."""
    t = 2.0
    _, grad = one_token(1.0, 1.0, NONE, temperature=t)
    expected = -(torch.nn.functional.one_hot(torch.tensor(Y), 3).float() - torch.softmax(Z / t, -1)) / t
    assert torch.allclose(grad, expected, atol=1e-6)


# --- the spec: defaults, rule, and the way settings reach the trainer ---------------------

MINIMAL = {"model": {"path": "/m"}, "inference": {}, "rollout": {"dataset": {"path": "/d.jsonl"}}}


def test_default_spec_is_stale_by_one_and_corrected_by_tis() -> None:
    spec = RLJobSpec.model_validate(MINIMAL)
    assert spec.rollout.max_staleness == 1
    ref = spec.trainer.reference
    assert ref.off_policy.mode is OffPolicyMode.tis
    assert (ref.off_policy.clip_eps_low, ref.off_policy.clip_eps_high, ref.off_policy.tis_cap) == (0.2, 0.2, 2.0)
    assert ref.max_grad_norm == 1.0


def test_stale_samples_without_correction_are_refused_naming_the_fields() -> None:
    raw = {**MINIMAL, "trainer": {"reference": {"offPolicy": {"mode": "none"}}}}
    with pytest.raises(ValueError, match="maxStaleness") as err:
        RLJobSpec.model_validate(raw)
    assert STALE_NEEDS_CORRECTION_MSG in str(err.value)
    assert "spec.trainer.reference.offPolicy.mode" in str(err.value)
    RLJobSpec.model_validate({**raw, "rollout": {**MINIMAL["rollout"], "maxStaleness": 0}})


def test_trainer_command_line_carries_every_loss_setting() -> None:
    """The operator and local mode pass `loss_flags`; the trainer parses them back unchanged."""
    from rljob_client.trainer.__main__ import parse_args

    spec = RLJobSpec.model_validate({
        **MINIMAL,
        "rollout": {**MINIMAL["rollout"], "sampling": {"temperature": 0.7}},
        "trainer": {"reference": {"maxGradNorm": 0.5,
                                  "offPolicy": {"mode": "clip", "clipEpsLow": 0.1, "clipEpsHigh": 0.28, "tisCap": 5}}},
    })
    ref = spec.trainer.reference
    args = parse_args(["--model", "/m", *ref.loss_flags(spec.rollout.sampling.temperature)])
    assert args.temperature == 0.7
    assert args.max_grad_norm == 0.5
    assert args.off_policy == ref.off_policy
    defaults = parse_args(["--model", "/m"])
    assert defaults.off_policy == OffPolicySpec()
    assert defaults.max_grad_norm == 1.0


def test_trainer_command_line_refuses_settings_the_spec_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    from rljob_client.trainer.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--model", "/m", "--clip-eps-low", "1.5"])
    assert "clip_eps_low" in capsys.readouterr().err


# --- the trainer's step: the model's own logits, the batch's engine logprobs --------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    out = tmp_path_factory.mktemp("tiny-policy")
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def batch_sampled_at(model_dir: Path, temperature: float) -> TrainBatch:
    """Two groups of two samples whose engine logprobs are the model's own at `temperature`."""
    from transformers import AutoModelForCausalLM

    tokens = np.array([[3, 4, 5, 6], [3, 4, 7, 8], [9, 10, 11, 12], [9, 10, 13, 0]], dtype=np.int32)
    resp_len = np.array([2, 2, 2, 1], dtype=np.int32)
    mask = np.zeros(tokens.shape, dtype=np.uint8)
    for i, r in enumerate(resp_len):
        mask[i, 2 : 2 + r] = 1
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        ids = torch.from_numpy(tokens.astype(np.int64))
        lp = grpo.token_logprobs(model(input_ids=ids).logits, ids, temperature)
    logprobs = np.zeros(tokens.shape, dtype=np.float32)
    logprobs[:, 1:] = lp.numpy() * mask[:, 1:]
    arrays = {
        "tokens": tokens, "response_mask": mask, "logprobs": logprobs,
        "prompt_lengths": np.full(4, 2, dtype=np.int32), "response_lengths": resp_len,
        "rewards": np.array([1.0, 0.0, 0.0, 1.0], dtype=np.float32),
        "advantages": np.zeros(4, dtype=np.float32), "weight_versions": np.zeros(4, dtype=np.int64),
        "prompt_indices": np.array([0, 0, 1, 1], dtype=np.int64), "group_indices": np.array([0, 0, 1, 1], dtype=np.int32),
        "sample_indices": np.array([0, 1, 0, 1], dtype=np.int32),
    }  # fmt: skip
    return TrainBatch(arrays=arrays, rollout_id=0, n_samples_per_prompt=2)


def test_trainer_scores_at_the_spec_temperature_against_the_batch_logprobs(tiny_model_dir: Path) -> None:
    from rljob_client.trainer.policy import PolicyTrainer

    spec = RLJobSpec.model_validate({**MINIMAL, "rollout": {**MINIMAL["rollout"], "sampling": {"temperature": 0.5}}})
    batch = batch_sampled_at(tiny_model_dir, temperature=0.5)
    matched = PolicyTrainer.from_spec(tiny_model_dir, spec).train_step(batch)
    assert matched.ratio_mean == pytest.approx(1.0, abs=1e-5)  # the same policy on both sides
    assert matched.clipped_fraction == 0.0
    unscaled = PolicyTrainer(tiny_model_dir, 1e-3).train_step(batch)  # temperature 1: another policy
    assert abs(unscaled.ratio_mean - 1.0) > 1e-3


def test_trainer_clips_the_gradient_norm_by_default(tiny_model_dir: Path) -> None:
    from rljob_client.trainer.policy import PolicyTrainer

    policy = PolicyTrainer(tiny_model_dir, 1e-3)
    assert policy.max_grad_norm == 1.0
    assert policy.correction == grpo.OffPolicyCorrection(OffPolicyMode.tis, 0.2, 0.2, 2.0)
    seen: list[float] = []
    original = torch.nn.utils.clip_grad_norm_

    def recording(parameters: object, max_norm: float, *a: object, **k: object) -> torch.Tensor:
        seen.append(max_norm)
        return original(parameters, max_norm, *a, **k)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.utils, "clip_grad_norm_", recording)
        policy.train_step(batch_sampled_at(tiny_model_dir, 1.0))
    assert seen == [1.0]
    assert PolicyTrainer(tiny_model_dir, 1e-3, max_grad_norm=0).max_grad_norm is None  # the spec's 0: off
