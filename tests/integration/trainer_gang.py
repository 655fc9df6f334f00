"""A checkpointing data-parallel trainer small enough to run as trainer pods, for test_trainer_restart.py.

Each rank trains one Linear layer with Adam on inputs drawn from its *own* global torch RNG
(seeded 100 + rank) and averages gradients with a gloo all-reduce. Checkpoints are the
reference trainer's own machinery: `Checkpointer` every SAVE_EVERY steps (rank 0 writes, the
other ranks hand it their RNG states through the process group's store, `StoreRanks`) and
`resume_from` on start, each rank taking back its own RNG states. So the weights after the last
step equal those of a run that never stopped (`expected_weights` computes that run in one process).

Steps are paced by the test: step s starts once the file OUT_DIR/gate holds a number > s.
Each rank appends `{"rank", "step", "pid"}` to OUT_DIR/steps.jsonl after each step.
Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (the trainer Job's), OUT_DIR, STEPS, SAVE_EVERY.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from rljob_client.ranks import StoreRanks
from rljob_client.trainer.checkpoint import Checkpoint, CheckpointStore, restore_checkpoint, take_checkpoint
from rljob_client.trainer.loop import StepRecord
from rljob_client.trainer.resume import Checkpointer, resume_from

GATE_POLL_SECONDS = 0.05
COLLECTIVE_TIMEOUT_SECONDS = 30


def seed_of(rank: int) -> int:
    return 100 + rank


def make_model() -> tuple[torch.nn.Linear, torch.optim.Adam]:
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def draw_inputs() -> torch.Tensor:
    """This step's inputs, from the calling rank's global RNG (what a resumed rank must get back)."""
    return torch.randn(8, 4)


def local_gradients(model: torch.nn.Linear, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean().backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def apply_gradients(model: torch.nn.Linear, optimizer: torch.optim.Adam, grads: list[torch.Tensor]) -> None:
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g
    optimizer.step()


def expected_weights(steps: int, world_size: int) -> dict[str, torch.Tensor]:
    """The weights after `steps` steps of an uninterrupted run of `world_size` ranks, in one process."""
    model, optimizer = make_model()
    states = []
    for rank in range(world_size):
        torch.manual_seed(seed_of(rank))
        states.append(torch.get_rng_state())
    for _ in range(steps):
        per_rank = []
        for rank in range(world_size):
            torch.set_rng_state(states[rank])
            per_rank.append(local_gradients(model, draw_inputs()))
            states[rank] = torch.get_rng_state()
        summed = [torch.stack(gs).sum(dim=0) / world_size for gs in zip(*per_rank, strict=True)]
        apply_gradients(model, optimizer, summed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def wait_for_gate(gate: Path, step: int) -> None:
    while not (gate.exists() and (text := gate.read_text().strip()) and int(text) > step):
        time.sleep(GATE_POLL_SECONDS)


class GangPolicy:
    """What Checkpointer and resume_from ask of a policy, for the Linear layer."""

    def __init__(self) -> None:
        self.model, self.optimizer = make_model()

    def checkpoint(self, step: int, weight_version: int) -> Checkpoint:
        return take_checkpoint(self.model, self.optimizer, step, weight_version)

    def restore(self, ckpt: Checkpoint, rank: int = 0) -> None:
        if not restore_checkpoint(ckpt, self.model, self.optimizer, rank):
            raise RuntimeError(f"checkpoint {ckpt.path} holds no RNG state of rank {rank}")

    @property
    def optimizer_steps(self) -> int:
        return max((int(s["step"]) for s in self.optimizer.state.values() if "step" in s), default=0)


async def train(rank: int, world: int, out: Path, steps: int, save_every: int) -> None:
    policy = GangPolicy()
    torch.manual_seed(seed_of(rank))
    ranks = StoreRanks.from_process_group()
    store = CheckpointStore(out / "checkpoints")
    ckpt = store.resume_point()
    start = await resume_from(ckpt, policy, rank=rank) if ckpt is not None else 0
    checkpointer = Checkpointer(store, save_every, policy, ranks=ranks)
    for step in range(start, steps):
        await asyncio.to_thread(wait_for_gate, out / "gate", step)
        grads = local_gradients(policy.model, draw_inputs())
        for g in grads:
            dist.all_reduce(g)
            g /= world
        apply_gradients(policy.model, policy.optimizer, grads)
        with (out / "steps.jsonl").open("a") as f:
            f.write(json.dumps({"rank": rank, "step": step, "pid": os.getpid()}) + "\n")
        checkpointer.after_step(StepRecord(step=step, weight_version=step + 1, reward_mean=0.0, reward_std=0.0,
                                           loss=0.0, samples=8, response_tokens=0))
    await checkpointer.close()
    ranks.close()


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_SECONDS))
    asyncio.run(train(rank, world, Path(os.environ["OUT_DIR"]), int(os.environ["STEPS"]), int(os.environ["SAVE_EVERY"])))
    dist.barrier()  # rank 0 hosts the store: it leaves last
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
