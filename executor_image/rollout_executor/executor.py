"""The RolloutExecutor itself: pure asyncio, no Ray (the Ray actor in actor.py wraps it).

A rollout is `batch_size` prompts x `n_samples_per_prompt` samples. `generate(id)` starts it in
the background (the trainer may overlap it with training); `get_batch(id)` waits for it,
drops GRPO groups that became too stale and regenerates them, and freezes the batch so that
every trainer rank shards the same one. Samples are stored by SampleKey: an answer for a key
that is already stored is discarded, so retries never duplicate a sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from rljob_client.wire.trainbatch import TrainBatch

from rollout_executor.batching import build_batch, check_groups_complete
from rollout_executor.config import ExecutorConfig
from rollout_executor.dataset import Position, Prompt, PromptDataset
from rollout_executor.engine_client import EngineClient, Tokenizer
from rollout_executor.evaluation import (
    EvalFleetProvider,
    EvalRecorder,
    EvalTask,
    eval_on_policy_fleet,
    eval_point,
    record_request,
    run_eval,
)
from rollout_executor.failures import SampleFailure, check_budget
from rollout_executor.generation import (
    EndpointsProvider,
    EnginePool,
    Generator,
    SamplingParams,
    WeightGate,
    static_endpoints,
)
from rollout_executor.metrics import ExecutorMetrics
from rollout_executor.rewards import RewardError, Scorer, load_reward, success_threshold
from rollout_executor.rollout_api import (
    DEFAULT_FUNCTION,
    MalformedSample,
    PromptRow,
    RolloutSample,
    check_sample,
)
from rollout_executor.samples import Sample, SampleKey, VocabInfo
from rollout_executor.staleness import VersionTracker, parse_version
from rollout_executor.state import ExecutorState, PendingRollout, load_state, save_state

log = logging.getLogger(__name__)

KEEP_FINISHED_ROLLOUTS = 4
KEEP_SAVED_STATES = 4  # rollout_<id>.json files kept by the per-rollout saves


@dataclass
class Rollout:
    rollout_id: int
    prompts: list[Prompt]
    start: Position
    end: Position
    samples: dict[SampleKey, Sample] = field(default_factory=dict)
    failures: dict[SampleKey, SampleFailure] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    batch: TrainBatch | None = None
    fetched_ranks: set[int] = field(default_factory=set)
    regenerations: int = 0
    error_reported: bool = False
    started_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None


class RolloutExecutor:
    def __init__(
        self,
        config: ExecutorConfig,
        endpoints_provider: EndpointsProvider | None = None,
        eval_fleet_provider: EvalFleetProvider | None = None,
        dataset: PromptDataset | None = None,
        vocab: VocabInfo | None = None,
        eval_recorder: EvalRecorder | None = None,
    ) -> None:
        self.config = config
        if endpoints_provider is None:
            if not config.engines.endpoints:
                raise ValueError("no engines: pass endpoints_provider or set config.engines.endpoints")
            endpoints_provider = static_endpoints(list(config.engines.endpoints))
        self._provider = endpoints_provider
        self._eval_provider = eval_fleet_provider
        self._eval_recorder = eval_recorder  # status.lastEval (the controller API's record_eval)
        self.evals: list[dict[str, Any]] = []  # the policy's eval points, without per-sample rewards
        self.dataset = dataset or PromptDataset.from_path(
            config.dataset_path,
            config.dataset_format,
            messages_field=config.messages_field,
            prompt_field=config.prompt_field,
            label_field=config.label_field,
            shuffle=config.shuffle,
            seed=config.seed,
        )
        self.eval_dataset = (
            PromptDataset.from_path(config.eval_dataset_path, config.dataset_format if config.dataset_format == "chat" else None,
                                    messages_field=config.messages_field, prompt_field=config.prompt_field,
                                    label_field=config.label_field, shuffle=False)
            if config.eval_dataset_path
            else self.dataset
        )
        self.vocab = vocab or (VocabInfo.from_model_dir(config.tokenizer_path) if config.tokenizer_path else None)
        self.reward_name = config.reward_function
        self.scorer = Scorer(config.reward_function, config.reward_args, workers=config.reward_workers,
                             timeout_seconds=config.reward_timeout_seconds)
        self.reward_fn = self.scorer.fn
        self.failures_by_reason: dict[str, int] = {}
        self.rollout_name = config.rollout_function or DEFAULT_FUNCTION
        self.rollout_fn = load_reward(self.rollout_name, "spec.rollout.function")
        self._tok: Tokenizer | None = None
        self.versions = VersionTracker(max_staleness=config.max_staleness)
        self.rollouts: dict[int, Rollout] = {}
        self.sampling = SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p)
        self._session: aiohttp.ClientSession | None = None
        self._generator: Generator | None = None
        self._gate: WeightGate | None = None
        self._update_lock = asyncio.Lock()
        self.duplicates_discarded = 0
        self.metrics = ExecutorMetrics(config.engines.namespace, config.job, config.max_staleness, self._request_counts)

    def _request_counts(self) -> tuple[int, int]:
        """(in flight, retried) as the gate and the generator count them."""
        g = self._generator
        return (self._gate.in_flight if self._gate else 0), (g.stats.retried if g else 0)

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._session is not None:
            return
        await self.scorer.start()
        if self.config.dataset_format == "chat":  # off the loop, and a missing tokenizer fails the start
            await asyncio.to_thread(self.tokenizer)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self._gate = WeightGate(version=self.versions.current)
        pool = EnginePool(
            provider=self._provider,
            concurrency=self.config.concurrency,
            refresh_seconds=self.config.engines.refresh_seconds,
            no_engine_timeout_seconds=self.config.no_engine_timeout_seconds,
        )
        self._generator = Generator(
            pool,
            self._gate,
            self.sampling,
            self._session,
            model=self.config.model,
            request_timeout_seconds=self.config.request_timeout_seconds,
            max_attempts=self.config.max_attempts_per_sample,
        )

    async def close(self) -> None:
        for ro in self.rollouts.values():
            if ro.task is not None and not ro.task.done():
                ro.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await ro.task
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.scorer.close()

    @property
    def generator(self) -> Generator:
        if self._generator is None:
            raise RuntimeError("RolloutExecutor.start() was not awaited")
        return self._generator

    # ---- generation --------------------------------------------------------------------

    def _ensure(self, rollout_id: int) -> Rollout:
        """The rollout, its prompts taken from the dataset on first sight and generation started."""
        ro = self.rollouts.get(rollout_id)
        if ro is None:
            start = self.dataset.position
            prompts = self.dataset.take(self.config.batch_size)
            ro = Rollout(rollout_id, prompts, start, self.dataset.position)
            self.rollouts[rollout_id] = ro
        if ro.batch is None and ro.task is None:
            ro.task = asyncio.ensure_future(self._fill(ro))
        return ro

    def _missing(self, ro: Rollout) -> list[SampleKey]:
        n = self.config.n_samples_per_prompt
        return [
            SampleKey(ro.rollout_id, g, s)
            for g in range(len(ro.prompts))
            for s in range(n)
            if SampleKey(ro.rollout_id, g, s) not in ro.samples and SampleKey(ro.rollout_id, g, s) not in ro.failures
        ]

    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, loaded on first use (chat templates, a rollout function's encode/decode)."""
        if self._tok is None:
            if not self.config.tokenizer_path:
                raise RuntimeError("no tokenizer: set spec.model.tokenizer (or spec.model.path)")
            try:
                from transformers import AutoTokenizer
            except ImportError as e:
                raise RuntimeError("chat prompts and a rollout function's tokenizer need the transformers package "
                                   f"in the executor's environment: {e}") from e
            self._tok = AutoTokenizer.from_pretrained(self.config.tokenizer_path)
        return self._tok

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        """A chat row's prompt: the model's chat template, with the generation prompt, as token ids."""
        return EngineClient(self.generator, SampleKey(-1, -1, -1), self.tokenizer).render(messages)

    def _row(self, ro: Rollout, key: SampleKey, n: int) -> PromptRow:
        p = ro.prompts[key.group]
        return PromptRow(key=key, index=p.index, text=p.text, messages=p.messages, label=p.label, record=p.record, n=n)

    async def _call(self, ro: Rollout, key: SampleKey, n: int) -> list[RolloutSample]:
        """The rollout function's samples for `key` (n of them from key.sample on), validated;
        MalformedSample, TimeoutError or the function's own exception otherwise."""
        client = EngineClient(self.generator, key, self.tokenizer)
        row = self._row(ro, key, n)
        args = self.config.rollout_function_args
        if self.config.rollout_function is None:  # the default: bounded by the generator's own timeouts
            out = await self.rollout_fn(client, row, **args)
        else:
            out = await asyncio.wait_for(self.rollout_fn(client, row, **args), self.config.rollout_function_timeout_seconds)
        if self.config.rollout_function_per_group and not isinstance(out, list | tuple):
            raise MalformedSample(f"returned {type(out).__name__}, not a list of samples (functionPerGroup)")
        got = list(out) if self.config.rollout_function_per_group else [out]
        if len(got) != n:
            raise MalformedSample(f"returned {len(got)} samples for a group of {n}")
        default_version = min(client.versions) if client.versions else None
        return [self._stamp(check_sample(s, default_version), default_version) for s in got]

    @staticmethod
    def _stamp(s: RolloutSample, version: int | None) -> RolloutSample:
        if s.weight_versions is None:
            s.weight_versions = [version] * len(s.response_token_ids) if version is not None else []
        return s

    async def _one(self, ro: Rollout, key: SampleKey, n: int = 1) -> None:
        """Samples key.sample .. key.sample+n-1 of a group: the rollout function, then the reward."""
        prompt = ro.prompts[key.group]
        keys = [SampleKey(key.rollout_id, key.group, key.sample + i) for i in range(n)]
        try:
            outs = await self._call(ro, key, n)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            reason = "timeout" if isinstance(e, TimeoutError) else "malformed" if isinstance(e, MalformedSample) else "error"
            what = (f"timed out after {self.config.rollout_function_timeout_seconds:g}s" if reason == "timeout"
                    else f"returned a malformed sample: {e}" if reason == "malformed" else f"raised {type(e).__name__}: {e}")
            if self.config.rollout_function is None:
                raise  # single-turn generation: the engines failed, the rollout fails as it always has
            for k in keys:
                if k not in ro.samples and k not in ro.failures:
                    self._fail(ro, SampleFailure(k, prompt.index, "rollout", reason,
                                                 f"rollout function {self.rollout_name} {what} for {k} (prompt {prompt.index})",
                                                 dropped=True))
            return
        if n == 1:  # no task of its own for the one sample: the default path's per-sample cost
            await self._score(ro, keys[0], prompt, outs[0])
        else:
            await asyncio.gather(*(self._score(ro, k, prompt, o) for k, o in zip(keys, outs, strict=True)))

    async def _score(self, ro: Rollout, key: SampleKey, prompt: Prompt, o: RolloutSample) -> None:
        versions = o.weight_versions or []
        sample = Sample(
            key=key,
            prompt_index=prompt.index,
            prompt=prompt.text,
            label=prompt.label,
            prompt_token_ids=o.prompt_token_ids,
            response_token_ids=o.response_token_ids,
            response_logprobs=o.logprobs,
            response=o.response,
            finish_reason=o.finish_reason,
            weight_version=min(versions) if versions else self.versions.current,
            engine=o.engine,
            record=prompt.record,
            loss_mask=o.loss_mask,
            token_weight_versions=versions if versions and min(versions) != max(versions) else None,
            metadata=o.metadata,
        )
        try:
            sample.reward = float(o.reward) if o.reward is not None else await self.scorer(sample.reward_input(self.vocab))
        except RewardError as e:
            if key in ro.samples or key in ro.failures:
                self.duplicates_discarded += 1
                return
            self._fail(ro, SampleFailure(key, prompt.index, "reward", e.reason, str(e),
                                         dropped=self.config.reward_on_error == "drop"))
            if self.config.reward_on_error == "drop":
                return
            sample.reward = self.config.reward_error_value
        if key in ro.samples:
            self.duplicates_discarded += 1
            return
        ro.samples[key] = sample
        self.metrics.sample_scored()

    def _fail(self, ro: Rollout, failure: SampleFailure) -> None:
        """Record a failed sample (metric, log, batch meta); past the budget, fail the rollout."""
        ro.failures[failure.key] = failure
        label = f"{failure.source}/{failure.reason}"
        self.failures_by_reason[label] = self.failures_by_reason.get(label, 0) + 1
        self.metrics.sample_failed(failure.source, failure.reason)
        log.warning("%s (prompt %d): %s%s", failure.key, failure.prompt_index, failure.message,
                    "; dropped from its group" if failure.dropped else "")
        check_budget(ro.failures, self.config.failure_budget, len(ro.prompts) * self.config.n_samples_per_prompt,
                     ro.rollout_id)

    async def _fill(self, ro: Rollout) -> None:
        """Generate and score every missing sample; the first error cancels the rest."""
        missing = self._missing(ro)
        if self.config.rollout_function_per_group:  # a group with any sample missing is made again whole
            n = self.config.n_samples_per_prompt
            groups = sorted({k.group for k in missing})
            calls = [(SampleKey(ro.rollout_id, g, 0), n) for g in groups]
        else:
            calls = [(k, 1) for k in missing]
        tasks = [asyncio.ensure_future(self._one(ro, k, n)) for k, n in calls]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        ro.finished_at = time.monotonic()

    def generate(self, rollout_id: int) -> None:
        """Start generating a rollout in the background (idempotent)."""
        self._ensure(int(rollout_id))

    async def get_batch(self, rollout_id: int) -> TrainBatch:
        """The whole, frozen batch of a rollout: complete groups, no sample older than maxStaleness."""
        ro = self._ensure(int(rollout_id))
        while ro.batch is None:
            assert ro.task is not None
            if ro.task.done() and (ro.task.cancelled() or ro.task.exception() is not None) and ro.error_reported:
                ro.error_reported = False
                for k in list(ro.failures):  # a retry scores its failed samples again, within a fresh budget
                    ro.samples.pop(k, None)
                ro.failures.clear()
                ro.task = asyncio.ensure_future(self._fill(ro))  # a new request after a reported failure: retry
            try:
                await asyncio.shield(ro.task)
            except Exception:
                ro.error_reported = True
                raise
            if ro.batch is not None:
                break
            by_group: dict[int, list[int]] = {}
            for k, s in ro.samples.items():
                by_group.setdefault(k.group, []).append(s.weight_version)
            stale = self.versions.stale_groups(by_group)
            if stale:
                dropped = [k for k in ro.samples if k.group in set(stale)]
                for k in dropped:
                    del ro.samples[k]
                for k in [k for k in ro.failures if k.group in set(stale)]:
                    del ro.failures[k]  # regenerated: its record goes with it
                self.versions.count_drop(len(stale), len(dropped))
                ro.regenerations += 1
                log.info("rollout %d: dropped %d stale groups (%d samples) at version %d; regenerating", ro.rollout_id, len(stale), len(dropped), self.versions.current)
                ro.task = asyncio.ensure_future(self._fill(ro))
                continue
            if self._missing(ro):
                ro.task = asyncio.ensure_future(self._fill(ro))
                continue
            samples = list(ro.samples.values())
            left = [(k.group, k.sample) for k, f in ro.failures.items() if f.dropped]
            check_groups_complete(samples, len(ro.prompts), self.config.n_samples_per_prompt, left)
            if not samples:
                raise RuntimeError(f"rollout {ro.rollout_id}: every sample failed and was dropped")
            batch = build_batch(samples, ro.rollout_id, self.config.n_samples_per_prompt)
            batch.meta.update(weight_version=self.versions.current, regenerations=ro.regenerations)
            if ro.failures:
                batch.meta["failed_samples"] = [f.to_dict() for f in sorted(ro.failures.values(), key=lambda f: f.key)]
            ro.batch = batch
            took = (ro.finished_at - ro.started_at) if ro.finished_at is not None else None
            self.metrics.batch_delivered([max(0, self.versions.current - s.weight_version) for s in samples],
                                         [float(s.reward or 0.0) for s in samples], took)
        return ro.batch

    async def get(self, rollout_id: int, rank: int = 0, world_size: int = 1) -> TrainBatch:
        batch = await self.get_batch(rollout_id)
        shard = batch.shard(rank, world_size)
        self.mark_fetched(int(rollout_id), rank, world_size)
        return shard

    def mark_fetched(self, rollout_id: int, rank: int, world_size: int) -> None:
        """Forget a rollout's batch once every rank took its shard (and old finished ones)."""
        ro = self.rollouts.get(rollout_id)
        if ro is None:
            return
        first_complete = len(ro.fetched_ranks) < world_size <= len(ro.fetched_ranks | {rank})
        ro.fetched_ranks.add(rank)
        done = [r for r, x in self.rollouts.items() if x.batch is not None]
        if len(ro.fetched_ranks) >= world_size:
            ro.samples.clear()
        if first_complete:
            self.persist_position(rollout_id)
        for r in done[:-KEEP_FINISHED_ROLLOUTS]:
            self.rollouts.pop(r, None)

    # ---- weights -----------------------------------------------------------------------

    def set_weight_version(self, version: int | str) -> int:
        v = self.versions.set(version)
        if self._gate is not None:
            self._gate.version = v
        return v

    async def begin_weight_update(self) -> dict[str, Any]:
        """Stop starting requests; drain or abort in-flight ones (spec.rollout.onWeightUpdate)."""
        assert self._gate is not None
        async with self._update_lock:  # a second begin (a retried call) finds the gate closed: a no-op
            n = await self._gate.close(self.config.on_weight_update) if self._gate.is_open else 0
        return {"mode": self.config.on_weight_update, "in_flight": n}

    async def end_weight_update(self, version: int | str | None = None) -> int:
        """Record the new version and let generation (and aborted retries) continue on it."""
        assert self._gate is not None
        try:
            if version is not None:
                self.set_weight_version(version)
        finally:  # a refused version still reopens generation: never leave the executor stuck
            self._gate.open(self.versions.current)
        return self.versions.current

    # ---- eval, state, stats ------------------------------------------------------------

    def _eval_task(self) -> EvalTask:
        c = self.config
        return EvalTask(
            prompts=self.eval_dataset.head(c.eval_prompts),
            sampling=SamplingParams(max_tokens=c.eval_max_tokens or c.max_tokens, temperature=c.eval_temperature,
                                    top_p=c.top_p if c.eval_temperature > 0 else 1.0),
            samples_per_prompt=c.eval_samples_per_prompt,
            threshold=success_threshold(self.reward_name, c.eval_success_threshold),
            reward_fn=self.reward_fn,
            reward_name=self.reward_name,
            reward_args=c.reward_args,
            vocab=self.vocab,
            scorer=self.scorer,
            render=self.render,
        )

    async def eval(self, rollout_id: int, weight_version: str | None = None,
                   checkpoint: str | None = None) -> dict[str, Any]:
        """Evaluate; `rollout_id` is the eval point (training steps done).

        Without spec.rollout.eval: on the eval fleet pinned to spec.inference.eval's checkpoint.
        With it (the policy being trained): on the eval fleet re-pinned to `checkpoint` (the
        step's exported weights) when both exist, else on the policy fleet; the result is kept
        for stats and recorded as status.lastEval.
        """
        assert self._session is not None
        rid, task, c = int(rollout_id), self._eval_task(), self.config
        if not c.eval_every_steps:
            return await run_eval(rid, self._eval_provider, task, self._session, c.model, c.concurrency)
        out: dict[str, Any] | None = None
        if checkpoint is not None and self._eval_provider is not None:
            out = await run_eval(rid, self._eval_provider, task, self._session, c.model, c.concurrency,
                                 checkpoint=checkpoint, weight_version=weight_version)
            if out["skipped"] and out["reason"] == "not_configured":
                out = None  # no eval fleet: the policy fleet serves the eval
        if out is None:
            out = await eval_on_policy_fleet(rid, self.generator, task)
        point = eval_point(out)
        self.evals.append(point)
        if not out["skipped"]:
            self.metrics.evaluated(str(out.get("fleet", "policy")), float(out["mean_reward"]), float(out["pass_at_1"]))
        if self._eval_recorder is not None and not out["skipped"]:
            try:
                await self._eval_recorder(record_request(out))
                out["recorded"] = True
            except Exception as e:  # the eval stands; only status.lastEval misses it
                log.warning("eval point %d: recording status.lastEval failed: %s", rid, e)
                out["recorded"] = False
        log.info("eval point %d: %s", rid, point)
        return out

    def state_after(self, rollout_id: int) -> ExecutorState:
        """The position after `rollout_id`'s prompts, and the rollouts already taken beyond it."""
        ro = self.rollouts.get(int(rollout_id))
        pos = ro.end if ro is not None else self.dataset.position
        pending = tuple(PendingRollout(r.rollout_id, r.start.epoch, r.start.offset, len(r.prompts))
                        for i, r in sorted(self.rollouts.items()) if i > int(rollout_id))
        return ExecutorState(rollout_id=int(rollout_id), dataset_epoch=pos.epoch, dataset_offset=pos.offset,
                             weight_version=self.versions.current, job=self.config.job, pending=pending)

    def persist_position(self, rollout_id: int) -> None:
        """With a state dir, save the position after a rollout every rank has taken, so that a
        replaced executor (its pod deleted) resumes there: its prompts are never handed out again.

        Best effort: a state dir that cannot be written costs that resumption, not the rollout."""
        if not self.config.state_dir:
            return
        try:
            save_state(self.config.state_dir, self.state_after(rollout_id), keep=KEEP_SAVED_STATES)
        except OSError as exc:
            log.warning("rollout %d: saving the dataset position to %s failed: %s", rollout_id, self.config.state_dir, exc)

    def save(self, rollout_id: int) -> str:
        """Persist the position after `rollout_id`'s prompts; later rollouts are redone after a restart."""
        if not self.config.state_dir:
            raise ValueError("no state directory configured (--state-dir)")
        return str(save_state(self.config.state_dir, self.state_after(rollout_id)))

    def checkpoint(self, rollout_id: int) -> dict[str, Any]:
        """The state after `rollout_id` as data for a trainer checkpoint (also saved here when there is a state dir)."""
        state = self.state_after(rollout_id)
        if self.config.state_dir:
            save_state(self.config.state_dir, state)
        return state.to_dict()

    def restore(self, data: dict[str, Any]) -> int:
        """Go back to a trainer checkpoint's state: the trainer resumed from it, so whatever came after is void.

        Rollouts past it are dropped (their samples came from weights the trainer no longer
        has), pending ones get their prompts back, the version is the checkpoint's even when
        that is lower, and a gate the dead trainer left closed reopens.
        """
        state = ExecutorState.from_dict(data)
        self._rewind(state, parse_version(state.weight_version))
        if self._gate is not None and not self._gate.is_open:
            self._gate.open(self.versions.current)
        if self.config.state_dir:
            save_state(self.config.state_dir, state)
        return state.rollout_id

    def load(self) -> int | None:
        """Resume from the newest saved state; returns its rollout id (None: nothing saved)."""
        if not self.config.state_dir:
            return None
        state = load_state(self.config.state_dir)
        if state is None:
            return None
        self._rewind(state, max(self.versions.current, parse_version(state.weight_version)))
        return state.rollout_id

    def _rewind(self, state: ExecutorState, version: int) -> None:
        for ro in self.rollouts.values():
            if ro.task is not None:
                ro.task.cancel()
        self.rollouts.clear()
        position = Position(state.dataset_epoch, state.dataset_offset)
        self.dataset.seek(position)
        for p in sorted(state.pending, key=lambda p: p.rollout_id):
            start = Position(p.epoch, p.offset)
            prompts, end = self.dataset.read(start, p.count)
            self.rollouts[p.rollout_id] = Rollout(p.rollout_id, prompts, start, end)
            position = end
        self.dataset.seek(position)
        log.info("rewound to after rollout %d (dataset %s, %d pending rollouts, version %d)",
                 state.rollout_id, position.to_dict(), len(state.pending), version)
        self.versions.current = version
        if self._gate is not None:
            self._gate.version = version

    def stats(self) -> dict[str, Any]:
        g = self._generator
        return {
            "job": self.config.job,
            "weight_version": self.versions.current,
            "max_staleness": self.versions.max_staleness,
            "stale_dropped_samples": self.versions.dropped_samples,
            "stale_dropped_groups": self.versions.dropped_groups,
            "duplicates_discarded": self.duplicates_discarded,
            "failed_samples": dict(self.failures_by_reason),
            "reward_workers_replaced": self.scorer.pool.replaced if self.scorer.pool else 0,
            "completed_requests": g.stats.completed if g else 0,
            "retried_requests": g.stats.retried if g else 0,
            "aborted_retries": g.stats.aborted_retries if g else 0,
            "in_flight": self._gate.in_flight if self._gate else 0,
            "updating_weights": bool(self._gate and not self._gate.is_open),
            "dataset_position": self.dataset.position.to_dict(),
            "evals": list(self.evals),
            "last_eval": self.evals[-1] if self.evals else None,
            "rollouts": {
                r: {"samples": len(x.samples), "done": x.batch is not None, "regenerations": x.regenerations}
                for r, x in self.rollouts.items()
            },
            "engines": g.pool.stats() if g else {},
        }

