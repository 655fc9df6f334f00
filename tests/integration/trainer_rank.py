"""One trainer rank as its own process, for tests/integration/test_trainer_ranks.py.

The real TrainingLoop with its real rank discipline: a gloo process group on loopback (the
gradient all-reduce of `policy.average_gradients`), StoreRanks over that group's store, the
HTTP controller client against the test's controller, the disk transport into the test's
stand-in engines. Only the policy is small (one Linear layer: the test is about ranks, not
learning) and the executor is reached over a small HTTP shim the test serves in front of a real
RolloutExecutor.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RLJOB_CONTROLLER_URL, RLJOB_NAME,
RLJOB_NAMESPACE, RLJOB_CONTROLLER_TOKEN_FILE, EXECUTOR_URL, SYNC_DIR, MODEL_DIR, STEPS, OUT_DIR,
and DIE_AT=<rank>:<step>[:push] (that rank exits with 17 as it starts training that step, or,
with `:push`, as it starts pushing the weights that step trained).
Exit 0 when every step ran; 3 with `RANK FAILED: <message>` on stderr for a RankFailed.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import torch
import torch.distributed as dist
from rljob_client.controller_client import InferenceControllerClient
from rljob_client.ranks import RankFailed, StoreRanks
from rljob_client.trainer.loop import LoopConfig, TrainingLoop
from rljob_client.trainer.policy import StepMetrics, average_gradients
from rljob_client.wire.trainbatch import TrainBatch, decode

from controller_runtime.api.spec import Engine
from controller_runtime.clients.factory import make_engine_client

GLOO_TIMEOUT_SECONDS = 60


class HttpRollouts:
    """The executor shim's routes, as the loop's RolloutSource."""

    def __init__(self, url: str, die_at_push: int | None = None) -> None:
        self.url = url
        self.die_at_push = die_at_push  # die as the gate closes for this version
        self.session: aiohttp.ClientSession | None = None
        self.version_next = 0

    def _s(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        return self.session

    async def get(self, rollout_id: int, rank: int, world_size: int) -> TrainBatch:
        async with self._s().get(f"{self.url}/get/{rollout_id}/{rank}/{world_size}") as r:
            r.raise_for_status()
            return decode(await r.read())

    async def _post(self, what: str, version: int | None = None) -> Any:
        async with self._s().post(f"{self.url}/{what}", json={"version": version}) as r:
            r.raise_for_status()
            return await r.json()

    async def set_weight_version(self, version: int) -> None:
        await self._post("set_weight_version", version)
        self.version_next = version + 1

    async def begin_weight_update(self) -> Any:
        if self.die_at_push is not None and self.version_next == self.die_at_push + 1:
            print(f"rank 0: dying as it pushes weights v{self.version_next}", file=sys.stderr, flush=True)
            os._exit(17)
        return await self._post("begin_weight_update")

    async def end_weight_update(self, version: int | None = None) -> Any:
        return await self._post("end_weight_update", version)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class TinyPolicy:
    """One Linear layer trained on the batch's rewards, with the real gradient all-reduce."""

    def __init__(self, model_dir: Path, rank: int, die_at: tuple[int, int] | None) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.model_dir = model_dir
        self.rank = rank
        self.die_at = die_at
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def train_step(self, batch: TrainBatch) -> StepMetrics:
        if self.die_at == (self.rank, batch.rollout_id):
            print(f"rank {self.rank}: dying at step {batch.rollout_id}", file=sys.stderr, flush=True)
            os._exit(17)
        started = time.perf_counter()
        rewards = torch.tensor(np.asarray(batch.rewards, dtype=np.float32))
        x = torch.ones(len(rewards), 4)
        loss = ((self.model(x).squeeze(-1) - rewards) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        average_gradients(self.model)
        self.opt.step()
        return StepMetrics(float(loss), float(rewards.mean()), float(rewards.std()), len(batch),
                           int(np.asarray(batch.response_lengths).sum()), 0.0, time.perf_counter() - started)


async def main() -> int:
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_SECONDS))
    die = env.get("DIE_AT", "").split(":")
    at_push = len(die) == 3 and die[2] == "push" and int(die[0]) == rank
    die_at = (int(die[0]), int(die[1])) if die[0] and not at_push else None
    controller = InferenceControllerClient(env["RLJOB_CONTROLLER_URL"], env["RLJOB_NAME"], env["RLJOB_NAMESPACE"],
                                           token_file=env["RLJOB_CONTROLLER_TOKEN_FILE"], holder=f"trainer-{rank}")
    rollouts = HttpRollouts(env["EXECUTOR_URL"], die_at_push=int(die[1]) if at_push else None)
    config = LoopConfig(steps=int(env["STEPS"]), sync_dir=Path(env["SYNC_DIR"]), holder=f"trainer-{rank}",
                        rank=rank, world_size=world, ready_timeout_seconds=10.0, retry_seconds=0.2,
                        rejoin_check_seconds=1.0, fleet_timeout_seconds=60.0)
    loop = TrainingLoop(config, controller, rollouts, TinyPolicy(Path(env["MODEL_DIR"]), rank, die_at),  # type: ignore[arg-type]
                        lambda endpoint: make_engine_client(Engine.vllm, endpoint),
                        ranks=StoreRanks.from_process_group(timeout_seconds=120.0))
    out = Path(env["OUT_DIR"]) / f"rank{rank}.json"
    try:
        records = await loop.run()
    except RankFailed as exc:
        print(f"RANK FAILED: {exc}", file=sys.stderr, flush=True)
        return 3
    finally:
        await rollouts.close()
        await controller.close()
    out.write_text(json.dumps([r.to_dict() for r in records]))
    return 0


if __name__ == "__main__":
    code = asyncio.run(main())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no process-group teardown: a peer may already be gone
