"""Checkpoints in a running trainer: save every N steps beside training, resume at start.

The files are `trainer/checkpoint.py`'s business; this module decides when to save and what a
resumed trainer puts back. A checkpoint taken after step s (its `step` is s + 1, the next
step to train) holds the weights that were pushed as version s + 1 and the executor's state
after rollout s, so a trainer resumed from it trains step s + 1 on the same prompts the first
attempt got, and nothing before it again.

Only the writer rank (rank 0) writes files: data-parallel ranks hold the same weights and
optimizer state after every all-reduced step. Their RNG states differ, though (each draws its
own dropout masks, its own samples), so at a checkpoint step every other rank hands its RNG
state to rank 0 through the process group's store (`RankSync.offer`/`collect`), and each rank
restores its own on resume.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rljob_client.errors import RLJobError
from rljob_client.ranks import RankSync, SingleRank
from rljob_client.trainer.checkpoint import Checkpoint, CheckpointStore, capture_rng
from rljob_client.trainer.loop import StepRecord
from rljob_client.trainer.policy import PolicyTrainer

log = logging.getLogger(__name__)

ExecutorState = Callable[[int], Awaitable[dict[str, Any] | None]]


class CheckpointSaveFailed(RLJobError, RuntimeError):
    """A background save failed; raised at the next step so that the run does not go on unprotected."""


class Checkpointer:
    """Saves a checkpoint after every `every`-th step, in the background, one save at a time.

    `after_step` runs between two steps (the loop's on_step): it copies the weights, the
    optimizer and the RNG states there and then, so the next step may start while the files
    are written. A failed save is raised at the next step boundary.
    """

    def __init__(self, store: CheckpointStore, every: int, policy: PolicyTrainer,
                 executor_state: ExecutorState | None = None, ranks: RankSync | None = None) -> None:
        self.store = store
        self.every = every
        self.policy = policy
        self.executor_state = executor_state
        self.ranks: RankSync = ranks or SingleRank()
        self._task: asyncio.Future[None] | None = None
        self.saved: list[int] = []

    def due(self, step: int) -> bool:
        return self.every > 0 and (step + 1) % self.every == 0

    def after_step(self, record: StepRecord) -> None:
        self._raise_failure()
        if not self.due(record.step):
            return
        if self.ranks.rank != 0:  # the writer saves; this rank's part is its RNG state
            self.ranks.offer("rng", record.step, json.dumps(capture_rng()))
            return
        ckpt = self.policy.checkpoint(record.step + 1, record.weight_version)
        self._task = asyncio.ensure_future(self._save(ckpt, record.step, self._task))

    async def _save(self, ckpt: Checkpoint, rollout_id: int, previous: asyncio.Future[None] | None) -> None:
        if previous is not None:
            await previous
        peers = await self.ranks.collect("rng", rollout_id)
        ckpt.rng = {"ranks": [*ckpt.rng["ranks"], *(json.loads(p) for p in peers)]}
        if self.executor_state is not None:
            state = await self.executor_state(rollout_id)
            if state is not None:  # the executor may already be a version further: the checkpoint's counts
                state = {**state, "weight_version": ckpt.weight_version}
            ckpt.executor = state
        path = await asyncio.to_thread(self.store.save, ckpt)
        self.saved.append(ckpt.step)
        log.info("checkpoint: step %d (weights v%d, %d optimizer steps) saved to %s", ckpt.step, ckpt.weight_version,
                 self.policy.optimizer_steps, path)

    def _raise_failure(self) -> None:
        if self._task is not None and self._task.done() and not self._task.cancelled() and self._task.exception():
            exc = self._task.exception()
            raise CheckpointSaveFailed(f"saving a checkpoint to {self.store.root} failed: {exc}") from exc

    async def close(self) -> None:
        """Wait for the save in progress (a trainer that ends keeps its last checkpoint); raise its failure."""
        if self._task is not None:
            try:
                await self._task
            except Exception as exc:
                raise CheckpointSaveFailed(f"saving a checkpoint to {self.store.root} failed: {exc}") from exc


async def resume_from(ckpt: Checkpoint, policy: PolicyTrainer, *, restore_executor: Callable[[dict[str, Any]], Awaitable[Any]]
                      | None = None, rank: int = 0) -> int:
    """Put `ckpt` back into the policy (this rank's RNG states; for the writer, the executor too); returns the
    step to start at."""
    policy.restore(ckpt, rank)
    if restore_executor is not None and ckpt.executor is not None:
        await restore_executor(ckpt.executor)
    log.info("resumed from checkpoint %s: step %d, weights v%d, %d optimizer steps", ckpt.path, ckpt.step,
             ckpt.weight_version, policy.optimizer_steps)
    return ckpt.step
