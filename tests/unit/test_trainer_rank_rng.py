"""Each trainer rank resumes its own RNG streams: at a checkpoint step the other ranks hand their
RNG states to rank 0 through the process group's store, and each rank takes back its own."""

from __future__ import annotations

import asyncio
import datetime
import socket
from pathlib import Path

import pytest
import torch
from rljob_client.ranks import SingleRank, StoreRanks
from rljob_client.trainer.checkpoint import (
    Checkpoint,
    CheckpointStore,
    capture_rng,
    rank_rng,
    restore_checkpoint,
    take_checkpoint,
)
from rljob_client.trainer.loop import StepRecord
from rljob_client.trainer.resume import Checkpointer
from torch.distributed import TCPStore


class LinearPolicy:
    """The two calls Checkpointer makes of a policy."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(2, 1)
        self.optimizer = torch.optim.Adam(self.model.parameters())

    def checkpoint(self, step: int, weight_version: int) -> Checkpoint:
        return take_checkpoint(self.model, self.optimizer, step, weight_version)

    optimizer_steps = 0


def record(step: int) -> StepRecord:
    return StepRecord(step=step, weight_version=step + 1, reward_mean=0.0, reward_std=0.0, loss=0.0, samples=1,
                      response_tokens=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_checkpoint_holds_every_ranks_own_rng_and_each_rank_resumes_its_own(tmp_path: Path) -> None:
    port = free_port()
    timeout = datetime.timedelta(seconds=10)
    host = TCPStore("127.0.0.1", port, 2, True, timeout=timeout, wait_for_workers=False)
    peer = TCPStore("127.0.0.1", port, 2, False, timeout=timeout)
    writer, other = StoreRanks(host, 0, 2, timeout_seconds=10), StoreRanks(peer, 1, 2, timeout_seconds=10)
    store = CheckpointStore(tmp_path)
    try:
        # Rank 1's RNG is somewhere else than rank 0's when both finish step 1 (a checkpoint step).
        torch.manual_seed(11)
        Checkpointer(store, 2, LinearPolicy(), ranks=other).after_step(record(1))  # type: ignore[arg-type]
        rank1_next = torch.rand(3)
        torch.manual_seed(22)
        saver = Checkpointer(store, 2, LinearPolicy(), ranks=writer)  # type: ignore[arg-type]
        saver.after_step(record(1))
        rank0_next = torch.rand(3)
        await asyncio.wait_for(saver.close(), 30)
    finally:
        writer.close()
        other.close()
    ckpt = store.load(2)
    assert len(ckpt.rng["ranks"]) == 2
    for rank, want in ((1, rank1_next), (0, rank0_next)):
        torch.manual_seed(99)  # a restarted rank's fresh seed
        policy = LinearPolicy()
        assert restore_checkpoint(ckpt, policy.model, policy.optimizer, rank)
        assert torch.equal(torch.rand(3), want), f"rank {rank} did not get its own RNG stream back"


def test_a_checkpoint_from_before_per_rank_states_is_rank_0s() -> None:
    old = capture_rng()
    assert rank_rng(old, 0) is old and rank_rng(old, 1) is None
    assert rank_rng({"ranks": [old]}, 1) is None  # saved by fewer ranks than resume


async def test_a_peer_that_never_hands_over_its_rng_fails_the_save_naming_it() -> None:
    port = free_port()
    host = TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    writer = StoreRanks(host, 0, 2, timeout_seconds=0.5)
    try:
        with pytest.raises(Exception, match="rank 1 did not hand over its rng of step 3"):
            await writer.collect("rng", 3)
    finally:
        writer.close()


async def test_a_single_rank_has_no_peers_to_collect_from() -> None:
    assert await SingleRank().collect("rng", 0) == []
