"""The policy being trained: a HuggingFace causal LM (float32 master weights; CUDA and bf16 autocast
when a GPU is there), its Adam, one step in micro-batches, an optional KL penalty.

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
                 correction: grpo.OffPolicyCorrection | None = None, micro_batch_size: int = 0,
                 kl_coef: float = 0.0, reference_dir: str | os.PathLike[str] | None = None,
                 device: str | torch.device | None = None) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model_dir = Path(model_dir)
        self.device = torch.device(device) if device is not None else default_device()
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        torch.nn.Module.to(self.model, self.device)
        self.model.train()
        self.micro_batch_size = micro_batch_size  # 0: the whole batch in one pass
        self.kl_coef = kl_coef
        self.reference: torch.nn.Module | None = None  # the frozen initial policy of the KL term
        if kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(str(reference_dir or model_dir), dtype=torch.float32)
            torch.nn.Module.to(ref, self.device)
            self.reference = ref.eval().requires_grad_(False)
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
                   correction=grpo.OffPolicyCorrection.from_spec(ref.off_policy),
                   micro_batch_size=ref.micro_batch_size, kl_coef=ref.kl_coef)

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

    def _autocast(self) -> Any:
        """bf16 autocast on a GPU (float32 master weights and optimizer); nothing on the CPU."""
        import contextlib

        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def micro_batches(self, n: int) -> list[slice]:
        """Row ranges of at most `micro_batch_size` samples (one range: the whole batch)."""
        size = self.micro_batch_size if 0 < self.micro_batch_size < n else max(n, 1)
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def accumulate_gradients(self, batch: TrainBatch) -> tuple[float, grpo.PolicyLoss, float]:
        """Gradients of the batch's loss, summed micro-batch by micro-batch; (loss, its terms, mean KL).

        Advantages are computed on the whole batch first (groups span micro-batches); each micro
        batch's loss is weighted by its share of the samples, so the accumulated gradient equals
        the gradient of the whole batch in one pass.
        """
        # np.array copies: the executor's arrays are read-only views of the object store.
        ids = torch.from_numpy(np.array(batch.tokens, dtype=np.int64))
        response_mask = torch.from_numpy(np.array(batch.response_mask, dtype=np.int64))
        lengths = np.asarray(batch.prompt_lengths) + np.asarray(batch.response_lengths)
        attention = torch.from_numpy((np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64))
        behaviour = torch.from_numpy(np.array(batch.logprobs, dtype=np.float32))
        rewards = torch.from_numpy(np.array(batch.rewards, dtype=np.float32))
        groups = torch.from_numpy(np.array(batch.group_indices, dtype=np.int64))
        adv = grpo.advantages(rewards, groups, self.algorithm)
        n = len(rewards)
        total, ratio_sum, clipped_sum, kl_sum, tokens = 0.0, 0.0, 0.0, 0.0, 0.0
        for rows in self.micro_batches(n):
            share = (rows.stop - rows.start) / n
            mb_ids, mb_mask = ids[rows].to(self.device), response_mask[rows].to(self.device)
            mb_attention = attention[rows].to(self.device)
            with self._autocast():
                logits = self.model(input_ids=mb_ids, attention_mask=mb_attention).logits
            logprobs = grpo.token_logprobs(logits, mb_ids, self.temperature)
            terms = grpo.corrected_policy_loss(logprobs, behaviour[rows].to(self.device), mb_mask,
                                               adv[rows].to(self.device), self.correction)
            loss = terms.loss
            if self.reference is not None:
                with torch.no_grad(), self._autocast():
                    ref_logits = self.reference(input_ids=mb_ids, attention_mask=mb_attention).logits
                kl = grpo.kl_k3(logprobs, grpo.token_logprobs(ref_logits, mb_ids, self.temperature), mb_mask).mean()
                loss = loss + self.kl_coef * kl
                kl_sum += float(kl.detach()) * share
            (loss * share).backward()
            total += float(loss.detach()) * share
            mb_tokens = float(mb_mask[:, 1:].sum())
            ratio_sum += terms.ratio_mean * mb_tokens
            clipped_sum += terms.clipped_fraction * mb_tokens
            tokens += mb_tokens
        summary = grpo.PolicyLoss(loss=torch.tensor(total), ratio_mean=ratio_sum / tokens if tokens else 1.0,
                                  clipped_fraction=clipped_sum / tokens if tokens else 0.0)
        return total, summary, kl_sum

    def train_step(self, batch: TrainBatch) -> StepMetrics:
        """One policy-gradient step on the batch, in micro-batches of `micro_batch_size` samples."""
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss, terms, _kl = self.accumulate_gradients(batch)
        average_gradients(self.model)
        if self.max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
        else:
            squares = [(p.grad.detach() ** 2).sum() for p in self.model.parameters() if p.grad is not None]
            norm = float(torch.sqrt(torch.stack(squares).sum())) if squares else 0.0
        self.optimizer.step()
        rewards = np.asarray(batch.rewards, dtype=np.float32)
        return StepMetrics(
            loss=loss,
            reward_mean=float(rewards.mean()) if len(rewards) else 0.0,
            reward_std=float(rewards.std()) if len(rewards) else 0.0,
            samples=len(rewards),
            response_tokens=int(np.asarray(batch.response_mask).sum()),
            grad_norm=norm,
            seconds=time.perf_counter() - started,
            ratio_mean=terms.ratio_mean,
            clipped_fraction=terms.clipped_fraction,
        )


def default_device() -> torch.device:
    """The GPU of this rank (LOCAL_RANK) when there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


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
