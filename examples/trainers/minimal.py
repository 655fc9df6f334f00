"""A complete RL trainer of your own on the rljob SDK: plain torch, one rank, GRPO with PPO clipping.

Run by the operator as `spec.trainer.command` (or by `rljob run examples/byo-trainer.yaml` on a
laptop); everything it needs comes from the environment the SDK reads (docs/trainers.md).
The training step is yours: the SDK only hands out batches and takes the weights back.
"""

from __future__ import annotations

import os
import time

import numpy as np
import rljob_client
import torch
from rljob_client.weights.export import iter_named_tensors
from rljob_client.wire.trainbatch import TrainBatch
from transformers import AutoModelForCausalLM

LEARNING_RATE = float(os.environ.get("LEARNING_RATE", "3e-3"))
TEMPERATURE = float(os.environ.get("TEMPERATURE", "1.0"))  # the engines' sampling temperature
CLIP = 0.2


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """GRPO: each sample's reward against the mean and std of its prompt's group."""
    adv = torch.zeros_like(rewards)
    for g in groups.unique():
        members = groups == g
        r = rewards[members]
        adv[members] = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
    return adv


def loss_of(model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
    """Clipped policy-gradient loss over the generated tokens (their mask and logprobs come in the batch)."""
    ids = torch.from_numpy(np.array(batch.tokens, dtype=np.int64))
    mask = torch.from_numpy(np.array(batch.response_mask, dtype=np.float32))[:, 1:]
    behaviour = torch.from_numpy(np.array(batch.logprobs, dtype=np.float32))[:, 1:]
    rewards = torch.from_numpy(np.array(batch.rewards, dtype=np.float32))
    groups = torch.from_numpy(np.array(batch.group_indices, dtype=np.int64))
    lengths = np.asarray(batch.prompt_lengths) + np.asarray(batch.response_lengths)
    attention = torch.from_numpy((np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64))

    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / TEMPERATURE
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(torch.where(mask > 0, logp - behaviour, torch.zeros_like(logp)))
    adv = group_advantages(rewards, groups)[:, None]
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def main() -> None:
    torch.manual_seed(0)
    job = rljob_client.connect()  # RLJOB_* environment: controller, executor, model, weights dir
    model = AutoModelForCausalLM.from_pretrained(job.env.model_path, torch_dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    with job:
        for batch in job.batches():  # resumes at the controller's weight version after a restart
            started = time.perf_counter()
            model.train()
            loss = loss_of(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            trained = time.perf_counter() - started
            job.publish_weights(iter_named_tensors(model))  # streamed to the engines, bucket by bucket
            record = job.report({"loss": float(loss.detach()), "train_seconds": trained})
            print(f"step {record.step}: reward {record.reward_mean:.3f} loss {record.loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
