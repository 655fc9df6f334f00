"""The trainer SDK's surface: every rank calls the same four things in the same order.

    job = rljob_client.connect()
    for batch in job.batches():                          # this rank's shard of rollout `job.step`
        metrics = my_train_step(batch)
        job.publish_weights(iter_named_tensors(model))   # every rank, once per batch
        job.report(metrics)

What each call does on the wire (the writer is rank 0; the others train and follow):

- `connect()` reads the trainer pod's environment (`rljob_client.env`), checks Ray and Python
  against the executor's, connects the controller client and the rollout stream, aborts a window
  this trainer's previous incarnation left open, and resumes at the controller's weight version.
- `batches()` pushes the starting version to the engines first (it waits for the fleet to come
  up), then per step: the writer prepares the rollout, every rank agrees on the live version
  (`ranks.share_version`), and each rank gets its shard from the executor.
- `publish_weights(named_tensors)` streams the tensors: disk writes safetensors shards bucket by
  bucket into `<weights dir>/<job>/v<N>`; gloo/nccl hand them to the broadcast of the window.
  Then the writer closes the executor's gate, opens a window, pushes, ends it, sets the version
  and reopens the gate (`rljob_client.publish`). Non-writer ranks drain the iterator, so the
  gathers a sharded model needs run on every rank.
- `report(metrics)` writes one step record (reward from the batch, the loss you give) where the
  operator's tooling and `rljob run` read it.

Calls out of order raise `CallOrderError` naming the call that was expected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from controller_runtime.api.spec import Engine, MemoryTag, PauseMode, WeightUpdateMethod
from controller_runtime.clients.factory import make_engine_client
from rljob_client import versions
from rljob_client.controller_client import ControllerClient, InferenceControllerClient, default_holder
from rljob_client.env import JobEnv, read
from rljob_client.errors import RLJobError
from rljob_client.publish import PublishSettings, WeightPublisher, abort_orphan_window
from rljob_client.ranks import RankSync, SingleRank, StoreRanks
from rljob_client.records import StepRecord
from rljob_client.weights.context import TransportContext, WeightTransport, push_all
from rljob_client.weights.export import drain, write_stream
from rljob_client.weights.transport import make_transport, push_from_disk
from rljob_client.wire.trainbatch import TrainBatch

log = logging.getLogger(__name__)


class CallOrderError(RLJobError, RuntimeError):
    """The trainer called the SDK out of order; the message names the call that was expected."""


class _StagedPath:
    """Push a directory the engines can read (the served model, or a staged version) to every engine."""

    def __init__(self, context: TransportContext, path: Path) -> None:
        self.context = context
        self.path = path

    async def stage(self, model: Any, version: int) -> None:
        """Already on disk."""

    async def push(self, window: Any, version: int, model: Any) -> None:
        async def one(engine: Any) -> None:
            client = self.context.engines(engine.endpoint)
            try:
                await push_from_disk(client, str(self.path), version, self.context.pause_mode)
            finally:
                await client.close()

        await push_all(window, self.context.concurrency, one)

    async def close(self) -> None:
        """Nothing held."""


class Job:
    """One rank's handle on the RLJob (see the module docstring for the calls and their order)."""

    def __init__(self, env: JobEnv, controller: ControllerClient, rollouts: Any, *,
                 ranks: RankSync | None = None, start_step: int = 0, loop: asyncio.AbstractEventLoop | None = None,
                 rejoin_check_seconds: float = 5.0) -> None:
        self.env = env
        self.controller = controller
        self.rollouts = rollouts  # RolloutStream (blocking) or anything with its get/gate calls
        self.ranks: RankSync = ranks or SingleRank()
        self.start_step = start_step
        self.version = start_step
        self.step: int | None = None  # the step of the batch in hand
        self._published: int | None = None  # the step whose weights were published
        self._batch: TrainBatch | None = None
        self._got_at = 0.0
        self._published_at = 0.0
        self._attempts = 1
        self._sync_seconds = 0.0
        self._loop = loop or asyncio.new_event_loop()
        self._owns_loop = loop is None
        self.rejoin_check_seconds = rejoin_check_seconds
        self.context = TransportContext(
            engines=lambda endpoint: make_engine_client(Engine(env.engine), endpoint),
            pause_mode=PauseMode(env.pause_mode), sync_dir=env.job_weights_dir, source_model_dir=env.model_path,
            bucket_bytes=env.bucket_megabytes * 2**20)
        self.method = WeightUpdateMethod(env.weight_update_method)
        self.transport: WeightTransport = make_transport(self.method, self.context)
        self.offload_tags = [MemoryTag(t) for t in env.offload_tags.split(",") if t]
        self.publisher = WeightPublisher(controller, _Gate(self), PublishSettings(
            holder=getattr(controller, "holder", "trainer-0"), ready_timeout_seconds=env.ready_timeout_seconds or None))

    # -- the four calls -------------------------------------------------------------------------

    @property
    def is_writer(self) -> bool:
        return self.env.rank == 0

    def batches(self, steps: int | None = None) -> Iterator[TrainBatch]:
        """This rank's batch of every step from `start_step` to `steps` (default RLJOB_STEPS)."""
        total = steps if steps is not None else self.env.steps
        if total < 1:
            raise CallOrderError("job.batches(steps=N): N is needed (RLJOB_STEPS is not set)")
        if self.step is not None:
            raise CallOrderError(f"job.batches() is running already (at step {self.step}); call it once")
        if self.is_writer:
            self._run(self._initial_sync())
        for step in range(self.start_step, total):
            self._run(self._begin(step))
            self.step, self._batch = step, self._run(self._get(step))
            self._got_at = time.perf_counter()
            if self.is_writer and self.offload_tags:
                self._run(self.controller.offload(self.offload_tags))
            yield self._batch
            if self._published != step:
                self.ranks.at(f"step {step}: skipped job.publish_weights()")
                raise CallOrderError(f"step {step}: expected job.publish_weights(...) before the next batch "
                                     "(every rank publishes once per batch, after training on it)")
        self.ranks.close()

    def publish_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Stream this step's weights to the engines (every rank calls it); returns the new version."""
        if self.step is None:
            raise CallOrderError("job.publish_weights() came before the first batch: expected a batch from "
                                 "job.batches() first (the SDK pushes the starting weights itself)")
        if self._published == self.step:
            raise CallOrderError(f"step {self.step}: job.publish_weights() was called twice; expected the next "
                                 "batch from job.batches()")
        version = self.step + 1
        self.ranks.at(f"step {self.step}: publishing weights v{version}")
        started = time.perf_counter()
        if not self.is_writer:
            drain(named_tensors)
        else:
            if self.offload_tags:
                self._run(self.controller.onload_weights())
            weights: Any = None
            transport: WeightTransport = self.transport
            if self.method is WeightUpdateMethod.disk:
                path = self.context.sync_dir / f"v{version}"
                write_stream(named_tensors, path, self.env.model_path, self.context.bucket_bytes)
                transport = _StagedPath(self.context, path)
            else:  # the broadcast sends a plan of every tensor first: the writer holds them for the window
                weights = dict(named_tensors)
            self._attempts = self._run(self.publisher.sync(version, transport, weights))
            if self.offload_tags:
                self._run(self.controller.onload_kv())
        self.version = version
        self._published = self.step
        self._published_at = time.perf_counter()
        self._sync_seconds = self._published_at - started
        return version

    def report(self, metrics: Mapping[str, float]) -> StepRecord:
        """Record this step (reward statistics from the batch, `loss` and the rest from `metrics`)."""
        if self.step is None or self._batch is None:
            raise CallOrderError("job.report() came before the first batch: expected a batch from job.batches()")
        if self._published != self.step:
            raise CallOrderError(f"step {self.step}: job.report() before job.publish_weights(); expected "
                                 "job.publish_weights(...) first")
        rewards = self._batch.rewards
        record = StepRecord(
            step=self.step, weight_version=self.version,
            reward_mean=float(rewards.mean()) if len(rewards) else 0.0,
            reward_std=float(rewards.std()) if len(rewards) else 0.0,
            loss=float(metrics.get("loss", 0.0)), samples=len(self._batch),
            response_tokens=int(self._batch.response_mask.sum()),
            batch_weight_versions=sorted({int(v) for v in self._batch.weight_versions}),
            train_seconds=float(metrics.get("train_seconds", 0.0)), sync_seconds=self._sync_seconds,
            update_attempts=self._attempts)
        if self.env.metrics_file:
            path = Path(self.env.metrics_file)
            if self.env.rank:
                path = path.with_name(f"{path.stem}-rank{self.env.rank}{path.suffix}")
            with path.open("a") as f:
                f.write(json.dumps(record.to_dict() | {k: float(v) for k, v in metrics.items()
                                                       if k not in record.to_dict()}) + "\n")
        return record

    def close(self) -> None:
        self.ranks.close()
        self._run(self.controller.close())
        close = getattr(self.rollouts, "close", None)
        if callable(close):
            close()
        if self._owns_loop:
            self._loop.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ---------------------------------------------------------------------------------

    def _run(self, aw: Any) -> Any:
        return self._loop.run_until_complete(aw)

    def _path_of(self, version: int) -> Path | None:
        """A directory holding `version` that the engines can reload, if there is one."""
        staged = self.context.sync_dir / f"v{version}"
        if staged.is_dir():
            return staged
        return self.env.model_path if version == 0 else None

    async def _initial_sync(self) -> None:
        await abort_orphan_window(self.controller, self.publisher.settings.holder)
        path = self._path_of(self.version)
        if path is None:
            raise CallOrderError(f"resuming at weights v{self.version}, but {self.context.sync_dir}/v{self.version} "
                                 "is gone: publish from a checkpoint (see docs/trainers.md)")
        await self.publisher.sync(self.version, _StagedPath(self.context, path), None)

    async def _begin(self, step: int) -> None:
        if self.is_writer:
            await self.controller.prepare_rollout(step)
        if self.env.world_size > 1:
            self.version = await self.ranks.share_version(step, self.version if self.is_writer else None)

    async def _get(self, step: int) -> TrainBatch:
        """The executor's batch; meanwhile the writer re-pushes the live version to cells that wait for weights."""
        self.ranks.at(f"step {step}: waiting for the rollout")
        get = asyncio.ensure_future(asyncio.to_thread(self.rollouts.get, step, self.env.rank, self.env.world_size))
        while True:
            done, _ = await asyncio.wait({get}, timeout=self.rejoin_check_seconds)
            if done:
                return get.result()
            if self.is_writer and await self.publisher.fleet_waits_for_weights():
                path = self._path_of(self.version)
                if path is not None:
                    await self.publisher.push(self.version, _StagedPath(self.context, path), None)


class _Gate:
    """The executor's gate through the blocking rollout stream."""

    def __init__(self, job: Job) -> None:
        self.job = job

    async def set_weight_version(self, version: int) -> None:
        await asyncio.to_thread(self.job.rollouts.set_weight_version, version)

    async def begin_weight_update(self) -> Any:
        return await asyncio.to_thread(self.job.rollouts.begin_weight_update)

    async def end_weight_update(self, version: int | None = None) -> Any:
        return await asyncio.to_thread(self.job.rollouts.end_weight_update, version)


def connect(environ: Mapping[str, str] | None = None) -> Job:
    """This rank's Job, from the environment a trainer pod (or `rljob run`) gives it.

    With WORLD_SIZE > 1 and no torch.distributed group yet, a gloo group is formed from
    MASTER_ADDR/MASTER_PORT (an FSDP trainer initialises its own NCCL group before connecting).
    """
    import os

    from rljob_client.rollout_stream import RolloutStream

    environ = os.environ if environ is None else environ
    env = read(environ)
    ours = versions.Runtime.here()
    theirs = versions.from_env(dict(environ))
    if theirs is not None:
        versions.check(ours, theirs)
    ranks: RankSync | None = None
    if env.world_size > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
        ranks = StoreRanks.from_process_group()
    loop = asyncio.new_event_loop()
    controller = InferenceControllerClient.from_env(holder=default_holder())
    try:
        stream = RolloutStream(env.name, address=env.rollout_address).connect()
    except RuntimeError as exc:
        rewritten = versions.from_ray_error(exc, ours)
        loop.run_until_complete(controller.close())
        loop.close()
        if rewritten is not None:
            raise rewritten from exc
        raise
    current = loop.run_until_complete(controller.cells()).weight_version
    start = int(current) if current and current.isdigit() else 0
    if start and not (env.job_weights_dir / f"v{start}").is_dir():
        start = 0  # nothing of that version to resume from: start over from the model
    if start:
        log.info("resuming at step %d (the controller serves weights v%d)", start, start)
    return Job(env, controller, stream, ranks=ranks, start_step=start, loop=loop)
