"""The training loop in miles' colocated step order, with a pluggable weight transport.

Per step (REFERENCE-miles.md "Training step order"):

1. `prepare_rollout(step)` on the controller, then the executor's `get(step)` (waits for the batch);
2. if the trainer shares GPUs with the engines (`trainer.colocate` and `offload.enabled`):
   `offload(tags)`;
3. train on the batch;
4. colocated: `onload_weights()`;
5. weight update: stage version `step + 1` (disk: write it to the shared dir), close the
   executor's gate (`begin_weight_update`: spec.rollout.onWeightUpdate drains or aborts the
   in-flight requests), open the window and push to every engine of it at once (the
   transport, `rljob_client/weights/transport.py`); `end_update_weights` (cells join serving) or, on any
   failure, `abort_update_weights` and retry; then the executor's `set_weight_version(step + 1)`
   and `end_weight_update` (the gate reopens, aborted requests retry on the new weights);
6. colocated: `onload_kv()`.

Overlap (`LoopConfig.overlap`, miles `train_async.py`): as soon as it has batch n, the writer
prepares rollout n+1 and has the executor start generating it (`generate(n + 1)`), so the
engines generate n+1 while the trainer trains on n. The weight update of step n still goes
through the window and the executor's gate; samples of n+1 generated on the old weights are one
version behind when n+1 is handed out (the executor drops and regenerates groups beyond
spec.rollout.maxStaleness, the off-policy correction weighs the rest). The default
(`from_spec`): overlap when maxStaleness >= 1 and the trainer does not share GPUs with the
engines (colocated engines are offloaded while the trainer trains: nothing could generate), since
with maxStaleness 0 every early sample would be dropped and generated again.

Before the first step, version 0 (the initial weights) is pushed the same way: it waits for
the fleet to come up (the window has no engine until a cell is PendingWeights or Serving)
and puts every engine on a known version. A trainer restarted mid-job resumes from the
controller's weight version when its sync dir still holds that version.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from controller_runtime.api.spec import Engine, MemoryTag, PauseMode, RLJobSpec, WeightUpdateMethod
from rljob_client.controller_client import ControllerClient
from rljob_client.publish import PublishSettings, WeightPublisher, WeightSyncFailed
from rljob_client.ranks import RankFailed, RankSync, SingleRank
from rljob_client.records import StepRecord
from rljob_client.trainer.evaluation import PolicyEvaluator
from rljob_client.trainer.policy import PolicyTrainer, StepMetrics
from rljob_client.weights.disk import DiskWeightWriter
from rljob_client.weights.transport import (
    DEFAULT_PUSH_CONCURRENCY,
    DiskTransport,
    EngineFactory,
    TransportContext,
    WeightTransport,
    make_transport,
    push_from_disk,
)

if TYPE_CHECKING:  # the executor's batch type; imported for annotations only
    from rljob_client.wire.trainbatch import TrainBatch

log = logging.getLogger(__name__)

__all__ = ["EngineFactory", "LoopConfig", "OverlappingRolloutSource", "RankFailed", "RolloutSource", "StepRecord", "ThreadedRolloutStream",
           "TrainingLoop", "WeightSyncFailed", "push_from_disk"]


class RolloutSource(Protocol):
    """The executor as the loop needs it (RolloutStream, wrapped to be awaitable).

    `begin_weight_update`/`end_weight_update` are the executor's gate around a window
    (spec.rollout.onWeightUpdate: drain finishes in-flight requests on the old weights, abort
    cancels them and retries them on the new ones); only the writer rank calls them.
    """

    async def get(self, rollout_id: int, rank: int, world_size: int) -> TrainBatch: ...

    async def set_weight_version(self, version: int) -> None: ...

    async def begin_weight_update(self) -> Any: ...

    async def end_weight_update(self, version: int | None = None) -> Any: ...


class OverlappingRolloutSource(RolloutSource, Protocol):
    """A source that can start a rollout in the background (needed only with `LoopConfig.overlap`)."""

    async def generate(self, rollout_id: int) -> None: ...


class ThreadedRolloutStream:
    """Adapts the blocking `RolloutStream` (Ray calls) to the loop without blocking the event loop."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    async def get(self, rollout_id: int, rank: int, world_size: int) -> TrainBatch:
        return await asyncio.to_thread(self.stream.get, rollout_id, rank, world_size)

    async def set_weight_version(self, version: int) -> None:
        await asyncio.to_thread(self.stream.set_weight_version, version)

    async def begin_weight_update(self) -> Any:
        return await asyncio.to_thread(self.stream.begin_weight_update)

    async def end_weight_update(self, version: int | None = None) -> Any:
        return await asyncio.to_thread(self.stream.end_weight_update, version)

    async def generate(self, rollout_id: int) -> None:
        await asyncio.to_thread(self.stream.generate, rollout_id)


@dataclass(frozen=True)
class LoopConfig:
    steps: int
    sync_dir: Path
    engine: str = Engine.vllm  # a name of controller_runtime.engines.ENGINES
    pause_mode: PauseMode = PauseMode.wait
    offload_tags: tuple[MemoryTag, ...] = ()  # empty: not colocated, no offload
    holder: str = "trainer-0"
    rank: int = 0
    world_size: int = 1
    max_update_attempts: int = 30  # miles retries a failed update this often
    retry_seconds: float = 2.0
    fleet_timeout_seconds: float = 1800.0  # waiting for an engine to take weights at all
    keep_versions: int = 2
    rejoin_check_seconds: float = 5.0  # while waiting for a rollout: does the fleet wait for weights?
    overlap: bool = False  # the writer starts rollout n+1 before training on n (from_spec: maxStaleness >= 1)
    weight_update_method: WeightUpdateMethod = WeightUpdateMethod.disk
    ready_timeout_seconds: float | None = None  # a window waits this long for starting cells (None: not at all)
    push_concurrency: int = DEFAULT_PUSH_CONCURRENCY  # engines of one window pushed at once
    bucket_bytes: int = 512 * 2**20  # gloo/nccl broadcast buckets
    transfer_timeout_seconds: float = 120.0  # gloo/nccl: bound on the group and each broadcast
    check_weights: bool = False  # weightUpdate.checkWeights: the trainer sends its checksums too

    @classmethod
    def from_spec(cls, spec: RLJobSpec, *, steps: int | None = None, sync_dir: str | os.PathLike[str] | None = None,
                  holder: str = "trainer-0", rank: int = 0, world_size: int = 1,
                  overlap: bool | None = None) -> LoopConfig:
        """`overlap=None`: overlap when maxStaleness >= 1 and not colocated (module docstring)."""
        inf = spec.inference
        colocated = spec.trainer.colocate and inf.offload.enabled
        if overlap is None:
            overlap = default_overlap(spec)
        return cls(
            steps=steps if steps is not None else spec.trainer.reference.steps,
            sync_dir=Path(sync_dir if sync_dir is not None else inf.weight_update.shared_path),
            engine=inf.engine,
            pause_mode=inf.weight_update.pause_mode,
            offload_tags=tuple(inf.offload.tags) if colocated else (),
            holder=holder,
            rank=rank,
            world_size=world_size,
            overlap=overlap,
            fleet_timeout_seconds=inf.health_check.startup_deadline_seconds,
            weight_update_method=inf.weight_update.method,
            ready_timeout_seconds=inf.weight_update.ready_timeout_seconds,
            bucket_bytes=inf.weight_update.bucket_megabytes * 2**20,
            transfer_timeout_seconds=inf.weight_update.transfer_timeout_seconds,
            check_weights=inf.weight_update.check_weights,
        )


def default_overlap(spec: RLJobSpec) -> bool:
    """Overlap when samples may be a version behind and the engines stay up while the trainer trains."""
    return spec.overlaps_generation


class TrainingLoop:
    """One rank's loop. Rank 0 (the writer) makes every control call and pushes the weights;
    the others train and wait at `ranks.share_version` until the step's weights are live."""

    def __init__(
        self,
        config: LoopConfig,
        controller: ControllerClient,
        rollouts: RolloutSource,
        policy: PolicyTrainer,
        engines: EngineFactory,
        *,
        writer: DiskWeightWriter | None = None,
        transport: WeightTransport | None = None,
        ranks: RankSync | None = None,
        on_step: Callable[[StepRecord], None] | None = None,
        on_status: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.controller = controller
        self.rollouts = rollouts
        self.policy = policy
        self.engines = engines
        self.transport = transport or make_transport(config.weight_update_method, TransportContext(
            engines=engines, pause_mode=config.pause_mode, sync_dir=config.sync_dir,
            source_model_dir=Path(policy.model_dir), keep_versions=config.keep_versions,
            concurrency=config.push_concurrency, writer=writer, bucket_bytes=config.bucket_bytes,
            transfer_timeout_seconds=config.transfer_timeout_seconds, check_weights=config.check_weights,
        ))
        self.writer = self.transport.writer if isinstance(self.transport, DiskTransport) else writer
        self.ranks: RankSync = ranks or SingleRank()
        self.on_step = on_step
        self.on_status = on_status
        self.records: list[StepRecord] = []
        self.evaluator: PolicyEvaluator | None = None  # spec.rollout.eval; set by whoever runs the loop
        self.version = 0
        self.prepared: set[int] = set()  # rollouts the writer already prepared (overlap: one step early)

    def _status(self, text: str) -> None:
        log.info("%s", text)
        if self.on_status is not None:
            self.on_status(text)

    @property
    def publisher(self) -> WeightPublisher:
        """The SDK's gate -> window -> transport sequence over this loop's controller and executor."""
        c = self.config
        return WeightPublisher(self.controller, self.rollouts, PublishSettings(
            holder=c.holder, fleet_timeout_seconds=c.fleet_timeout_seconds, max_update_attempts=c.max_update_attempts,
            retry_seconds=c.retry_seconds, ready_timeout_seconds=c.ready_timeout_seconds), on_status=self._status)

    @property
    def is_writer(self) -> bool:
        """Rank 0 writes weights and drives the window; other ranks only train."""
        return self.config.rank == 0

    async def run(self, stop: asyncio.Event | None = None, start_step: int = 0,
                  initial_sync: bool = True) -> list[StepRecord]:
        """Steps `start_step`..steps-1; first pushes version `start_step` unless the caller already did."""
        if self.is_writer and initial_sync:
            self._status("pushing the initial weights (waits for an engine to come up)")
            await self.sync_weights(start_step)
        if not self.is_writer:
            self.version = start_step
        try:
            for step in range(start_step, self.config.steps):
                if stop is not None and stop.is_set():
                    break
                record = await self.step(step)
                self.records.append(record)
                if self.on_step is not None:
                    self.on_step(record)
        finally:
            self.ranks.close()
        return self.records

    async def begin_step(self, step: int) -> None:
        """The writer prepares the rollout; then every rank agrees that weights v`step` are live.

        The barrier is here, before any rank asks for the rollout: the writer has pushed the
        version of the previous step and told the executor, so the batch each rank gets is
        frozen at the version this step expects.
        """
        if self.is_writer and step not in self.prepared:
            await self.prepare(step)
        if self.config.world_size > 1:
            self.version = await self.ranks.share_version(step, self.version if self.is_writer else None)

    async def prepare(self, step: int) -> None:
        await self.controller.prepare_rollout(step)
        self.prepared.add(step)

    async def start_next_rollout(self, step: int) -> None:
        """Overlap: the writer prepares rollout `step + 1` and the executor starts generating it now."""
        following = step + 1
        if not (self.config.overlap and self.is_writer and following < self.config.steps):
            return
        generate = getattr(self.rollouts, "generate", None)
        if generate is None:
            raise TypeError(f"LoopConfig.overlap needs a rollout source with generate(); {type(self.rollouts).__name__} has none")
        await self.prepare(following)
        await generate(following)

    async def step(self, step: int) -> StepRecord:
        started = time.perf_counter()
        await self.begin_step(step)
        self._status(f"step {step}: waiting for rollout")
        self.ranks.at(f"step {step}: waiting for the rollout")
        batch = await self.get_batch(step)
        got = time.perf_counter()
        await self.start_next_rollout(step)  # before training on `step`: the engines work meanwhile
        if self.is_writer and self.config.offload_tags:
            await self.controller.offload(list(self.config.offload_tags))
        self._status(f"step {step}: training on {len(batch)} samples")
        self.ranks.at(f"step {step}: training (gradient all-reduce)")
        try:
            metrics: StepMetrics = await asyncio.to_thread(self.policy.train_step, batch)
        except RuntimeError as exc:
            if self.config.world_size == 1:
                raise
            raise await self.ranks.failure(exc, f"step {step}: training") from exc
        if self.is_writer and self.config.offload_tags:
            await self.controller.onload_weights()
        trained = time.perf_counter()
        attempts = 1
        if self.is_writer:
            self.ranks.at(f"step {step}: pushing weights v{step + 1}")
            attempts = await self.sync_weights(step + 1)
            if self.config.offload_tags:
                await self.controller.onload_kv()
        done = time.perf_counter()
        if self.is_writer and self.evaluator is not None:  # the new weights are live; the next rollout waits
            await self.evaluator.after_update(step + 1)
        return StepRecord(
            step=step,
            weight_version=step + 1,
            reward_mean=metrics.reward_mean,
            reward_std=metrics.reward_std,
            loss=metrics.loss,
            samples=metrics.samples,
            response_tokens=metrics.response_tokens,
            batch_weight_versions=sorted({int(v) for v in batch.weight_versions}),
            rollout_seconds=got - started,
            train_seconds=metrics.seconds,
            sync_seconds=done - trained,
            step_seconds=done - started,
            update_attempts=attempts,
            ratio_mean=metrics.ratio_mean,
            clipped_fraction=metrics.clipped_fraction,
        )

    async def get_batch(self, step: int) -> TrainBatch:
        """The executor's batch; meanwhile, re-push the current weights if no engine serves but some wait for weights.

        A recreated cell joins serving only after a completed weight update. When every cell
        was recreated (one-cell jobs: any engine restart), nobody generates, so the rollout
        would wait for an update that only comes after the rollout: rank 0 breaks the cycle
        by pushing the version it already has.
        """
        get = asyncio.ensure_future(self.rollouts.get(step, self.config.rank, self.config.world_size))
        try:
            while True:
                done, _ = await asyncio.wait({get}, timeout=self.config.rejoin_check_seconds)
                if done:
                    return get.result()
                if self.is_writer and await self.fleet_waits_for_weights():
                    self._status(f"step {step}: no engine serving; pushing weights v{self.version} to the waiting cells")
                    await self.push(self.version)
        finally:
            if not get.done():
                get.cancel()

    async def fleet_waits_for_weights(self) -> bool:
        return await self.publisher.fleet_waits_for_weights()

    async def sync_weights(self, version: int) -> int:
        """Stage `version` and publish it inside the executor's gate (rljob_client.publish); returns the attempts."""
        await self.transport.stage(self.policy.model, version)
        attempts = await self.publisher.sync(version, self.transport, self.policy.model)
        self.version = version
        return attempts

    async def push(self, version: int) -> int:
        """Open windows until one completes (rljob_client.publish.WeightPublisher.push)."""
        return await self.publisher.push(version, self.transport, self.policy.model)
