"""The policy being trained: a HuggingFace causal LM in float32 on CPU, its Adam, one step.

Kept apart from the loop (which talks to the controller, the executor and the engines) so a
step can be run and measured on its own, and from grpo.py (the pure loss algebra).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from rljob_client.trainer import grpo

if TYPE_CHECKING:  # the executor's batch type; imported for annotations only
    from rljob_client.trainbatch import TrainBatch


@dataclass(frozen=True)
class StepMetrics:
    loss: float
    reward_mean: float
    reward_std: float
    samples: int
    response_tokens: int
    grad_norm: float
    seconds: float


class PolicyTrainer:
    """Loads the model from a model dir (the initial weights, or a sync dir to resume from)."""

    def __init__(self, model_dir: str | os.PathLike[str], learning_rate: float, algorithm: grpo.Algorithm = "grpo",
                 seed: int = 0, max_grad_norm: float | None = None) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model_dir = Path(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.train()
        self.algorithm: grpo.Algorithm = algorithm
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=learning_rate)

    def train_step(self, batch: TrainBatch) -> StepMetrics:
        """One policy-gradient step on a whole batch (the toy's 64 samples fit in one pass)."""
        started = time.perf_counter()
        # np.array copies: the executor's arrays are read-only views of the object store.
        ids = torch.from_numpy(np.array(batch.tokens, dtype=np.int64))
        response_mask = torch.from_numpy(np.array(batch.response_mask, dtype=np.int64))
        lengths = np.asarray(batch.prompt_lengths) + np.asarray(batch.response_lengths)
        attention = torch.from_numpy((np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64))
        rewards = torch.from_numpy(np.array(batch.rewards, dtype=np.float32))
        groups = torch.from_numpy(np.array(batch.group_indices, dtype=np.int64))
        adv = grpo.advantages(rewards, groups, self.algorithm)

        logits = self.model(input_ids=ids, attention_mask=attention).logits
        loss = grpo.policy_gradient_loss(grpo.token_logprobs(logits, ids), response_mask, adv)
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
