"""The RolloutExecutor as a named, detached Ray actor (`rljob-executor-<job>`, namespace `rljob`).

Trainers reach it with Ray Client (`rljob_client.rollout_stream.RolloutStream`). Bulk data
stays in the object store: `get` puts the rank's shard there and returns a `ShardRef`
(reference + sizes); the same shard is also served by the HTTP side channel
(datachannel.py) for trainers outside the Ray node, where Ray Client would proxy the bytes.

Methods (all async; the actor runs many calls at once, so `get` waiting for generation does
not block `set_weight_version` or the weight-update hooks):

    ready() -> dict                         start; returns {"data_url", "token", "job", ...}
    generate(rollout_id) -> None            start a rollout in the background
    get(rollout_id, rank, world_size) -> ShardRef
    set_weight_version(v) -> int            going backwards raises
    begin_weight_update() -> dict           drain or abort in-flight requests
    end_weight_update(version) -> int       continue on the new weights
    eval(rollout_id, weight_version, checkpoint) -> dict
                                            evaluate (spec.rollout.eval: the policy at that step), see evaluation.py
    save(rollout_id) -> str / load() -> int | None
    checkpoint(rollout_id) -> dict          the state after a rollout, for a trainer checkpoint
    restore(state) -> int                   back to a trainer checkpoint's state (version may go down)
    stats() -> dict
    set_endpoints(urls) -> None             replace a static engine list (local mode, tests)
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import ray
from rljob_client.wire.trainbatch import ShardRef, TrainBatch

from controller_runtime.api.control import EvalFleetResponse, RecordEvalRequest
from rollout_executor.config import ACTOR_NAMESPACE, EngineSource, ExecutorConfig, actor_name
from rollout_executor.datachannel import DataChannel
from rollout_executor.evaluation import EvalFleetProvider, EvalRecorder
from rollout_executor.executor import RolloutExecutor
from rollout_executor.generation import EndpointsProvider

log = logging.getLogger(__name__)

MAX_CONCURRENCY = 1000
KEEP_SHARDS = 64


class _MutableEndpoints:
    def __init__(self, urls: list[str]) -> None:
        self.urls = list(urls)

    async def __call__(self) -> list[str]:
        return list(self.urls)


def _providers(
    source: EngineSource, job: str
) -> tuple[EndpointsProvider, EvalFleetProvider | None, EvalRecorder | None, _MutableEndpoints | None]:
    """Engine discovery, the eval-fleet provider and the status.lastEval recorder for an
    EngineSource (built inside the actor); without a controller there is nowhere to record."""
    if source.controller_url:
        from rljob_client.controller_client import InferenceControllerClient

        kwargs: dict[str, Any] = {"token_file": source.token_path} if source.token_path else {}
        client = InferenceControllerClient(source.controller_url, job, source.namespace, **kwargs)

        async def from_controller() -> list[str]:
            return list((await client.cells()).serving_endpoints)

        async def eval_fleet(checkpoint: str | None = None, weight_version: str | None = None) -> EvalFleetResponse:
            return await client.eval_fleet(checkpoint, weight_version)

        async def record_eval(point: RecordEvalRequest) -> None:
            await client.record_eval(point)

        return from_controller, eval_fleet, record_eval, None
    url = source.router_url or source.engines_url
    fixed = _MutableEndpoints([url] if url else list(source.endpoints))
    return fixed, None, None, fixed


class ExecutorActor:
    def __init__(self, config: ExecutorConfig) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.config = config
        provider, eval_provider, recorder, self._static = _providers(config.engines, config.job)
        self.executor = RolloutExecutor(config, endpoints_provider=provider, eval_fleet_provider=eval_provider,
                                        eval_recorder=recorder)
        self._token = secrets.token_urlsafe(32)
        self._channel: DataChannel | None = None
        self._shards: dict[tuple[int, int, int], ShardRef] = {}
        self._batches: dict[tuple[int, int, int], TrainBatch] = {}  # shards served only over the side channel
        self._started = asyncio.Lock()
        self._data_url: str | None = None

    async def ready(self) -> dict[str, Any]:
        async with self._started:
            if self._channel is None:
                await self.executor.start()
                self._channel = DataChannel(self._shard_batch, self._token, self.config.data_host, self.config.data_port,
                                            metrics=self.executor.metrics.exposition)
                port = await self._channel.start()
                host = self.config.data_advertise_host or self.config.data_host
                if host in ("0.0.0.0", "::", ""):
                    host = ray.util.get_node_ip_address()
                self._data_url = f"http://{host}:{port}"
        return {"job": self.config.job, "data_url": self._data_url, "token": self._token, "weight_version": self.executor.versions.current,
                "eval_every_steps": self.config.eval_every_steps}

    async def _shard_ref(self, rollout_id: int, rank: int, world_size: int) -> ShardRef:
        key = (int(rollout_id), int(rank), int(world_size))
        ref = self._shards.get(key)
        if ref is None:
            shard = self._batches.pop(key, None)
            if shard is None:
                shard = await self.executor.get(*key)
            ref = ShardRef(
                rollout_id=key[0], rank=key[1], world_size=key[2], ref=ray.put(shard), nbytes=shard.nbytes, n_samples=len(shard)
            )
            self._shards[key] = ref
            self._forget_old_shards()
        return ref

    async def _shard_batch(self, rollout_id: int, rank: int, world_size: int) -> TrainBatch:
        """The shard for the side channel: from the actor's own memory, not through the object store.

        A `ray.put` copies the whole shard and reading it back is
        a round trip to the raylet, both for bytes the socket copies anyway; a shard some rank took
        over Ray already is served from the object store (a zero-copy view), never held twice."""
        key = (int(rollout_id), int(rank), int(world_size))
        ref = self._shards.get(key)
        shard = self._batches.get(key)
        if ref is not None:
            shard = await ref.ref
        elif shard is None:
            shard = await self.executor.get(*key)
            self._batches[key] = shard
            self._forget_old_shards()
        self.executor.metrics.shard_served()  # the side channel's own count: its address is the one trainers used
        return shard

    def _forget_old_shards(self) -> None:
        """Keep the newest KEEP_SHARDS shards (a rank may fetch its shard again after a failure)."""
        for old in sorted({*self._shards, *self._batches})[:-KEEP_SHARDS]:
            self._shards.pop(old, None)
            self._batches.pop(old, None)

    async def generate(self, rollout_id: int) -> None:
        await self.ready()
        self.executor.generate(int(rollout_id))

    async def get(self, rollout_id: int, rank: int = 0, world_size: int = 1) -> ShardRef:
        await self.ready()
        return await self._shard_ref(rollout_id, rank, world_size)

    async def set_weight_version(self, version: int | str) -> int:
        return self.executor.set_weight_version(version)

    async def begin_weight_update(self) -> dict[str, Any]:
        await self.ready()
        return await self.executor.begin_weight_update()

    async def end_weight_update(self, version: int | str | None = None) -> int:
        await self.ready()
        return await self.executor.end_weight_update(version)

    async def eval(self, rollout_id: int, weight_version: str | None = None, checkpoint: str | None = None) -> dict[str, Any]:
        await self.ready()
        return await self.executor.eval(int(rollout_id), weight_version, checkpoint)

    async def save(self, rollout_id: int) -> str:
        return self.executor.save(int(rollout_id))

    async def load(self) -> int | None:
        self._shards.clear()
        self._batches.clear()
        return self.executor.load()

    async def checkpoint(self, rollout_id: int) -> dict[str, Any]:
        return self.executor.checkpoint(int(rollout_id))

    async def restore(self, state: dict[str, Any]) -> int:
        self._shards.clear()
        self._batches.clear()
        return self.executor.restore(state)

    async def stats(self) -> dict[str, Any]:
        out = self.executor.stats()
        out["data_url"] = self._data_url
        out["shards_in_object_store"] = len(self._shards)
        out["shards_in_actor_memory"] = len(self._batches)
        return out

    async def set_endpoints(self, urls: list[str]) -> None:
        if self._static is None:
            raise ValueError("engines come from the controller; set_endpoints only replaces a static list")
        self._static.urls = [u.rstrip("/") for u in urls]

    async def shutdown(self) -> None:
        if self._channel is not None:
            await self._channel.stop()
        await self.executor.close()


def create_actor(config: ExecutorConfig, replace: bool = True, timeout_s: float = 120.0) -> tuple[Any, dict[str, Any]]:
    """Create the job's named detached actor on the connected Ray cluster; returns (handle, ready info).

    A leftover actor of the same name (an executor that died while its Ray head lived on) is
    killed first when `replace`, so the new one starts from the saved state, not from a
    half-run rollout.
    """
    name = actor_name(config.job)
    if replace:
        try:
            old = ray.get_actor(name, namespace=ACTOR_NAMESPACE)
        except ValueError:
            old = None
        if old is not None:
            ray.kill(old, no_restart=True)
            _wait_gone(name)
    # Any: ray's stubs type an actor's methods as plain coroutines, without `.remote`.
    handle: Any = (
        ray.remote(ExecutorActor)
        .options(name=name, namespace=ACTOR_NAMESPACE, lifetime="detached", max_concurrency=MAX_CONCURRENCY, num_cpus=0)
        .remote(config)
    )
    info: dict[str, Any] = ray.get(handle.ready.remote(), timeout=timeout_s)
    return handle, info


def _wait_gone(name: str, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=ACTOR_NAMESPACE)
        except ValueError:
            return
        time.sleep(0.2)
    raise TimeoutError(f"actor {name} did not go away within {timeout_s}s")
