"""Completions from the serving engines over the OpenAI API, with retries that lose nothing.

- `EnginePool` knows the engines (from an injectable `endpoints_provider`), how many requests
  each has in flight (at most `concurrency`), and which failed recently (a short, growing
  cool-down), and hands out the least-loaded healthy one.
- `WeightGate` is the weight-update bracket: while closed no request starts; `drain` waits for
  the in-flight ones, `abort` cancels them (closing the connection makes vLLM abort the
  request) and their samples are retried once the gate opens on the new weights.
- `Generator.complete(key, prompt)` returns one completion with token ids and logprobs. A
  request that fails on one engine is retried on another; the caller stores results by
  SampleKey, so nothing is lost or counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from rljob_client.errors import RLJobError

from controller_runtime.clients.completions import completion_request, parse_completion
from controller_runtime.errors import EngineProtocolError
from rollout_executor.samples import SampleKey

log = logging.getLogger(__name__)

EndpointsProvider = Callable[[], Awaitable[list[str]]]
VERSION_HEADER = "X-Weight-Version"


class GenerationError(RLJobError):
    """A sample cannot be generated (request rejected, attempts or waiting time exhausted)."""


class EngineFailure(RLJobError):
    """One attempt failed because of the engine (connection, 5xx, garbage): try another."""


def static_endpoints(urls: list[str]) -> EndpointsProvider:
    fixed = [u.rstrip("/") for u in urls]

    async def provider() -> list[str]:
        return list(fixed)

    return provider


@dataclass
class _EngineState:
    in_flight: int = 0
    failures: int = 0
    cooldown_until: float = 0.0
    requests: int = 0
    errors: int = 0


@dataclass
class EnginePool:
    provider: EndpointsProvider
    concurrency: int
    refresh_seconds: float = 2.0
    no_engine_timeout_seconds: float = 600.0
    max_cooldown_seconds: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _engines: dict[str, _EngineState] = field(default_factory=dict)
    _current: list[str] = field(default_factory=list)
    _refreshed_at: float = -1e18
    _changed: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        """Set when a slot frees up. An Event, not a Condition: a cancelled Condition.wait must
        re-take the lock, and many cancelled waiters (a rollout stopped by a failing reward)
        could then stall the cancellation."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    async def refresh(self, force: bool = False) -> list[str]:
        now = self.clock()
        if not force and now - self._refreshed_at < self.refresh_seconds:
            return self._current
        try:
            urls = [u.rstrip("/") for u in await self.provider()]
        except Exception as e:  # keep serving from the last list; the provider may come back
            log.warning("engine discovery failed, keeping %d known engines: %s", len(self._current), e)
            self._refreshed_at = now
            return self._current
        self._refreshed_at = now
        self._current = urls
        for u in urls:
            self._engines.setdefault(u, _EngineState())
        return urls

    def _pick(self, urls: list[str], exclude: set[str]) -> str | None:
        now = self.clock()
        free = [u for u in urls if self._engines[u].in_flight < self.concurrency and self._engines[u].cooldown_until <= now]
        preferred = [u for u in free if u not in exclude] or free
        if not preferred:
            return None
        return min(preferred, key=lambda u: (self._engines[u].in_flight, self._engines[u].failures))

    async def acquire(self, exclude: set[str] | None = None) -> str:
        """An engine with a free slot; waits (re-discovering engines) up to no_engine_timeout."""
        exclude = exclude or set()
        deadline = self.clock() + self.no_engine_timeout_seconds
        changed = self._event()
        while True:
            changed.clear()
            urls = await self.refresh()
            url = self._pick(urls, exclude)
            if url is not None:
                st = self._engines[url]
                st.in_flight += 1
                st.requests += 1
                return url
            if self.clock() >= deadline:
                raise GenerationError(
                    f"no serving engine had a free slot for {self.no_engine_timeout_seconds:.0f}s "
                    f"(known engines: {urls or 'none'})"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(0.5, self.refresh_seconds))

    async def release(self, url: str, ok: bool) -> None:
        st = self._engines[url]
        st.in_flight -= 1
        if ok:
            st.failures = 0
        else:
            st.failures += 1
            st.errors += 1
            st.cooldown_until = self.clock() + min(self.max_cooldown_seconds, 0.25 * 2 ** (st.failures - 1))
            self._refreshed_at = -1e18  # the fleet may have changed: ask again
        self._event().set()

    def give_back(self, url: str) -> None:
        """Return a slot that was acquired but never used: no request, no verdict on the engine."""
        st = self._engines[url]
        st.in_flight -= 1
        st.requests -= 1
        self._event().set()

    def stats(self) -> dict[str, dict[str, int]]:
        return {u: {"in_flight": s.in_flight, "requests": s.requests, "errors": s.errors} for u, s in self._engines.items()}


class WeightGate:
    """Brackets weight updates: closed → no new request; drain or abort the in-flight ones."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight: set[asyncio.Future[Any]] = set()
        self._aborted: set[asyncio.Future[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.aborted_requests = 0

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait_open(self) -> None:
        await self._open.wait()

    def track(self, fut: asyncio.Future[Any]) -> None:
        self._in_flight.add(fut)
        self._idle.clear()

    def untrack(self, fut: asyncio.Future[Any]) -> None:
        self._in_flight.discard(fut)
        self._aborted.discard(fut)
        if not self._in_flight:
            self._idle.set()

    def was_aborted(self, fut: asyncio.Future[Any]) -> bool:
        return fut in self._aborted

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def close(self, mode: str) -> int:
        """Close the gate; `drain` waits for in-flight requests, `abort` cancels them. Returns how
        many were drained or aborted.

        A request whose engine has answered stays tracked until its sampler resumes, a loop turn
        later. `abort` counts and cancels only those still waiting for an answer (`cancel()` is
        true): one already answered keeps its sample, on the weights it ran on, and counting it
        aborted made the window's count disagree with the retries the generator made whenever a
        close landed in that turn (test_executor and test_trainer_ranks compare the two).
        """
        if mode not in ("drain", "abort"):
            raise ValueError(f"spec.rollout.onWeightUpdate {mode!r}: expected drain or abort")
        self._open.clear()
        if mode == "abort":
            cancelled = [fut for fut in list(self._in_flight) if fut.cancel()]
            self._aborted.update(cancelled)
            n = len(cancelled)
            self.aborted_requests += n
        else:
            n = len(self._in_flight)
        await self._idle.wait()
        return n

    def open(self, version: int | None = None) -> None:
        if version is not None:
            self.version = version
        self._open.set()


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Completion:
    key: SampleKey
    engine: str
    weight_version: int
    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None


@dataclass
class GeneratorStats:
    completed: int = 0
    retried: int = 0
    aborted_retries: int = 0


def sample_completion(url: str, key: SampleKey, data: Any, version: int, header_version: str | None) -> Completion:
    """One sample from a /v1/completions reply, parsed by controller_runtime's one parser.

    Whatever the engine got wrong (garbage, no token ids or logprobs, a count mismatch, an
    abort while it paused for a weight update) is an `EngineFailure`: the sample is retried on
    another engine rather than failing the rollout. `header_version` (the engine's
    X-Weight-Version, when it sends one) overrides the version the gate tagged the request with.
    """
    try:
        parsed = parse_completion(url, data, want_logprobs=True)
    except EngineProtocolError as e:
        raise EngineFailure(f"{url}: completion without token ids/logprobs ({e})") from e
    if not parsed.choices:
        raise EngineFailure(f"{url}: completion without token ids/logprobs (no choices)")
    choice = parsed.choices[0]
    if choice.prompt_token_ids is None:
        raise EngineFailure(f"{url}: completion without token ids/logprobs (no prompt_token_ids)")
    if choice.finish_reason == "abort":
        raise EngineFailure(f"{url}: request aborted by the engine (paused for a weight update?)")
    if header_version is not None:
        try:
            version = int(header_version)
        except ValueError:
            log.warning("%s sent a non-integer %s %r; using %d", url, VERSION_HEADER, header_version, version)
    return Completion(
        key=key,
        engine=url,
        weight_version=version,
        text=choice.text,
        prompt_token_ids=list(choice.prompt_token_ids),
        token_ids=list(choice.token_ids),
        logprobs=list(choice.logprobs or ()),
        finish_reason=choice.finish_reason,
    )


class Generator:
    def __init__(
        self,
        pool: EnginePool,
        gate: WeightGate,
        sampling: SamplingParams,
        session: aiohttp.ClientSession,
        model: str | None = None,
        request_timeout_seconds: float = 300.0,
        max_attempts: int = 20,
    ) -> None:
        self.pool = pool
        self.gate = gate
        self.sampling = sampling
        self.session = session
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_seconds)
        self.max_attempts = max_attempts
        self.stats = GeneratorStats()
        self._model_names: dict[str, str] = {}

    async def _model_name(self, url: str) -> str:
        """The name the engine serves (vLLM: --served-model-name, default the --model path)."""
        if url in self._model_names:
            return self._model_names[url]
        try:
            async with self.session.get(f"{url}/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status >= 500:
                    raise EngineFailure(f"{url}/v1/models: HTTP {r.status}")
                data = await r.json(content_type=None) if r.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise EngineFailure(f"{url}/v1/models: {type(e).__name__}: {e}") from e
        models = [m.get("id") for m in data.get("data", []) if m.get("id")]
        name = self.model if self.model in models or not models else models[0]
        if name is None:
            raise EngineFailure(f"{url}/v1/models lists no model")
        self._model_names[url] = name
        return name

    async def _post(self, url: str, key: SampleKey, prompt: str | list[int], version: int, sampling: SamplingParams) -> Completion:
        payload = completion_request(
            prompt,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            n=1,
            logprobs=True,
            seed=None,
            model=await self._model_name(url),
            stop_token_ids=None,
            ignore_eos=False,
            extra={"top_p": sampling.top_p, "stop": list(sampling.stop)} if sampling.stop else {"top_p": sampling.top_p},
        )
        try:
            async with self.session.post(f"{url}/v1/completions", json=payload, timeout=self.timeout) as r:
                body = await r.read()
                if r.status >= 500 or r.status in (408, 429):
                    raise EngineFailure(f"{url}: HTTP {r.status}: {body[:200]!r}")
                if r.status >= 400:
                    raise GenerationError(f"{url} rejected the request for {key}: HTTP {r.status}: {body[:500]!r}")
                header_version = r.headers.get(VERSION_HEADER)
                data = json.loads(body)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise EngineFailure(f"{url}: {type(e).__name__}: {e}") from e
        return sample_completion(url, key, data, version, header_version)

    async def complete(self, key: SampleKey, prompt: str | list[int], sampling: SamplingParams | None = None) -> Completion:
        """One sample, retried on other engines until it succeeds or attempts run out."""
        sampling = sampling or self.sampling
        failed: set[str] = set()
        errors: list[str] = []
        attempts = 0
        while True:
            await self.gate.wait_open()
            url = await self.pool.acquire(exclude=failed)
            if not self.gate.is_open:
                # The gate closed while this request waited for a slot: started now, it would
                # run on the old weights (or hit an engine mid-reload) after the drain or abort
                # has returned. Give the slot back and wait for the new weights.
                self.pool.give_back(url)
                continue
            # Read after the wait: a request is tagged with the weights it actually runs on.
            # No await between the check above and track(): close() sees every started request.
            version = self.gate.version
            req = asyncio.ensure_future(self._post(url, key, prompt, version, sampling))
            self.gate.track(req)
            ok = False
            try:
                result = await req
                ok = True
                self.stats.completed += 1
                return result
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if self.gate.was_aborted(req) and (me is None or me.cancelling() == 0):
                    ok = True  # the engine is fine; the weights are changing
                    self.stats.aborted_retries += 1
                    continue
                raise
            except EngineFailure as e:
                attempts += 1
                failed.add(url)
                errors.append(str(e))
                self.stats.retried += 1
                log.info("retrying %s elsewhere after: %s", key, e)
                if attempts >= self.max_attempts:
                    raise GenerationError(f"{key} failed {attempts} times; last errors: {errors[-3:]}") from e
            finally:
                self.gate.untrack(req)
                await self.pool.release(url, ok)
