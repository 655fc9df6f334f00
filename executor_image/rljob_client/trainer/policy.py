"""The policy being trained: a HuggingFace causal LM in float32 on CPU, its Adam, one step.

Kept apart from the loop (which talks to the controller, the executor and the engines) so a
step can be run and measured on its own, and from grpo.py (the pure loss algebra).

Its defaults are the spec's (`ReferenceTrainerSpec`): gradient-norm clipping at 1.0 and the
`tis` correction against the engine's sampling logprobs; `from_spec` takes the job's values,
temperature included, so the gradient is for the policy the engines sampled from.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from controller_runtime.api.spec import OffPolicySpec, ReferenceTrainerSpec, RLJobSpec
from rljob_client.trainer import grpo
from rljob_client.trainer.checkpoint import Checkpoint, restore_checkpoint, take_checkpoint

if TYPE_CHECKING:  # the executor's batch type; imported for annotations only
    from rljob_client.wire.trainbatch import TrainBatch

log = logging.getLogger(__name__)

DEFAULT_MAX_GRAD_NORM = ReferenceTrainerSpec().max_grad_norm


@dataclass(frozen=True)
class StepMetrics:
    loss: float
    reward_mean: float
    reward_std: float
    samples: int
    response_tokens: int
    grad_norm: float  # before clipping
    seconds: float
    ratio_mean: float = 1.0  # mean pi_train / pi_engine over response tokens
    clipped_fraction: float = 0.0  # response tokens the correction clipped or capped


class PolicyTrainer:
    """Loads the model from a model dir (the initial weights, or a sync dir to resume from)."""

    def __init__(self, model_dir: str | os.PathLike[str], learning_rate: float, algorithm: grpo.Algorithm = "grpo",
                 seed: int = 0, max_grad_norm: float | None = DEFAULT_MAX_GRAD_NORM, *, temperature: float = 1.0,
                 correction: grpo.OffPolicyCorrection | None = None) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model_dir = Path(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.train()
        self.algorithm: grpo.Algorithm = algorithm
        self.max_grad_norm = max_grad_norm if max_grad_norm else None  # 0 (the spec's "off") or None: no clipping
        self.temperature = temperature
        self.correction = correction if correction is not None else grpo.OffPolicyCorrection.from_spec(OffPolicySpec())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=learning_rate)

    @classmethod
    def from_spec(cls, model_dir: str | os.PathLike[str], spec: RLJobSpec, seed: int = 0) -> PolicyTrainer:
        """The trainer as `spec.trainer.reference` and the sampling temperature configure it."""
        ref = spec.trainer.reference
        return cls(model_dir, ref.learning_rate, ref.algorithm, seed=seed, max_grad_norm=ref.max_grad_norm,
                   temperature=spec.executor.sampling.temperature,
                   correction=grpo.OffPolicyCorrection.from_spec(ref.off_policy))

    def checkpoint(self, step: int, weight_version: int, executor: dict[str, Any] | None = None) -> Checkpoint:
        """This trainer's state after training step `step - 1` (this rank's RNG states), copied."""
        return take_checkpoint(self.model, self.optimizer, step, weight_version, executor)

    def restore(self, ckpt: Checkpoint, rank: int = 0) -> None:
        """Continue from `ckpt`: its weights (full precision), the optimizer's moments and step counts, and
        this rank's own RNG states (a rank the checkpoint has none for keeps its seeded ones, and says so)."""
        if not restore_checkpoint(ckpt, self.model, self.optimizer, rank):
            log.warning("checkpoint %s holds no RNG state of rank %d: it keeps its seeded RNGs", ckpt.path, rank)

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken so far (Adam's step count): a resumed trainer continues the count."""
        steps = [int(s["step"]) for s in self.optimizer.state.values() if "step" in s]
        return max(steps, default=0)

    def train_step(self, batch: TrainBatch) -> StepMetrics:
        """One policy-gradient step on a whole batch (the toy's 64 samples fit in one pass)."""
        started = time.perf_counter()
        # np.array copies: the executor's arrays are read-only views of the object store.
        ids = torch.from_numpy(np.array(batch.tokens, dtype=np.int64))
        response_mask = torch.from_numpy(np.array(batch.response_mask, dtype=np.int64))
        lengths = np.asarray(batch.prompt_lengths) + np.asarray(batch.response_lengths)
        attention = torch.from_numpy((np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64))
        behaviour = torch.from_numpy(np.array(batch.logprobs, dtype=np.float32))
        rewards = torch.from_numpy(np.array(batch.rewards, dtype=np.float32))
        groups = torch.from_numpy(np.array(batch.group_indices, dtype=np.int64))
        adv = grpo.advantages(rewards, groups, self.algorithm)

        logits = self.model(input_ids=ids, attention_mask=attention).logits
        terms = grpo.corrected_policy_loss(grpo.token_logprobs(logits, ids, self.temperature), behaviour,
                                           response_mask, adv, self.correction)
        loss = terms.loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        average_gradients(self.model)
        if self.max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
        else:
            squares = [(p.grad.detach() ** 2).sum() for p in self.model.parameters() if p.grad is not None]
            norm = float(torch.sqrt(torch.stack(squares).sum())) if squares else 0.0
        self.optimizer.step()
        return StepMetrics(
            loss=float(loss.detach()),
            reward_mean=float(rewards.mean()) if len(rewards) else 0.0,
            reward_std=float(rewards.std(unbiased=False)) if len(rewards) else 0.0,
            samples=len(rewards),
            response_tokens=int(response_mask.sum()),
            grad_norm=norm,
            seconds=time.perf_counter() - started,
            ratio_mean=terms.ratio_mean,
            clipped_fraction=terms.clipped_fraction,
        )


def average_gradients(model: torch.nn.Module) -> None:
    """Data-parallel ranks (torch.distributed initialised by the caller) average their gradients."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world
