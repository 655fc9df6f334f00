"""Lease-based leader election (coordination.k8s.io/v1 Lease), client-go's algorithm.

kopf's peering only pauses operators with lower priority; it is not mutual exclusion. Here a
replica runs kopf (every handler, daemon and status write) only while it holds the Lease, and
a replica that cannot renew within `renew_deadline` stops acting before any other replica
may take over (`lease_duration` > `renew_deadline`). Like client-go, expiry is judged by
*this* replica's clock from the moment it last saw the record change, never by comparing
the remote `renewTime` with the local clock, so clock skew between nodes cannot make two
leaders.

`LeaseMachine` is the pure state machine (tested with a fake clock); `LeaderElector` drives
it against a `LeaseStore` (the Kubernetes API in production).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol

from controller_runtime.clock import Clock, RealClock, ticks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    duration_seconds: float
    acquire_time: float | None = None
    renew_time: float | None = None
    transitions: int = 0


class LeaseConflict(Exception):
    """Someone else wrote the Lease first (HTTP 409 on create or update)."""


class LeaseStore(Protocol):
    async def get(self) -> tuple[LeaseRecord, str] | None:
        """The Lease and its resourceVersion, or None when it does not exist."""
        ...

    async def create(self, record: LeaseRecord) -> str: ...

    async def update(self, record: LeaseRecord, resource_version: str) -> str: ...


class Action(StrEnum):
    create = "create"  # no Lease yet
    acquire = "acquire"  # take over a free or expired Lease
    renew = "renew"  # we hold it
    wait = "wait"  # someone else holds a live Lease


@dataclass(frozen=True)
class Step:
    action: Action
    record: LeaseRecord | None = None  # what to write (None for wait)


class LeaseMachine:
    """Decides, from what the store shows and the local clock, what to write; tracks leadership."""

    def __init__(self, identity: str, lease_duration: float, renew_deadline: float) -> None:
        if renew_deadline >= lease_duration:
            raise ValueError("renew_deadline must be shorter than lease_duration")
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self._observed: LeaseRecord | None = None
        self._observed_at: float | None = None
        self._last_renew: float | None = None  # local time of our last successful write

    @property
    def observed_holder(self) -> str | None:
        return self._observed.holder if self._observed else None

    def round_budget(self, now: float, retry_period: float) -> float:
        """How long one read-decide-write round may take: while leading, until the renew
        deadline lapses (a slower round would leave a stale `leading` flag up past it);
        otherwise up to the renew deadline, and never less than one retry period."""
        if self._last_renew is not None and now - self._last_renew < self.renew_deadline:
            return max(self._last_renew + self.renew_deadline - now, 0.001)
        return max(self.renew_deadline, retry_period)

    def is_leader(self, now: float) -> bool:
        """True while our last successful write is younger than the renew deadline."""
        return self._last_renew is not None and now - self._last_renew < self.renew_deadline

    def step(self, current: LeaseRecord | None, now: float) -> Step:
        if current is None:
            return Step(Action.create, LeaseRecord(self.identity, self.lease_duration, now, now, 0))
        if current != self._observed:
            self._observed, self._observed_at = current, now
        if current.holder == self.identity:
            return Step(Action.renew, replace(current, renew_time=now, duration_seconds=self.lease_duration))
        assert self._observed_at is not None
        free = not current.holder
        expired = now >= self._observed_at + current.duration_seconds
        if free or expired:
            return Step(
                Action.acquire,
                LeaseRecord(self.identity, self.lease_duration, now, now, current.transitions + 1),
            )
        return Step(Action.wait)

    def written(self, record: LeaseRecord, now: float) -> None:
        """Our write succeeded: we lead until now + renew_deadline unless we renew again."""
        self._observed, self._observed_at = record, now
        self._last_renew = now

    def lost(self) -> None:
        """Forget leadership at once (a conflict showed someone else holds it, or we released it)."""
        self._last_renew = None

    def release_record(self, current: LeaseRecord) -> LeaseRecord | None:
        """What to write on a clean shutdown so a standby takes over without waiting for expiry."""
        if current.holder != self.identity:
            return None
        return replace(current, holder=None, duration_seconds=1)


class LeaderElector:
    """Runs the Lease loop; `leading` is set while this replica may act."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        lease_duration: float,
        renew_deadline: float,
        retry_period: float,
        clock: Clock | None = None,
        on_started_leading: Callable[[], Awaitable[None]] | None = None,
        on_stopped_leading: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.machine = LeaseMachine(identity, lease_duration, renew_deadline)
        self.retry_period = retry_period
        self.clock = clock or RealClock()
        self.leading = asyncio.Event()
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._resource_version: str | None = None
        self._current: LeaseRecord | None = None

    @property
    def identity(self) -> str:
        return self.machine.identity

    @property
    def leader(self) -> str | None:
        """Who holds the Lease as far as this replica knows (for the 503 answer)."""
        return self.machine.identity if self.is_leader() else self.machine.observed_holder

    def is_leader(self) -> bool:
        return self.machine.is_leader(self.clock.now())

    async def tick(self) -> None:
        """One round: read, decide, write; then raise or drop the `leading` flag."""
        now = self.clock.now()
        try:
            async with asyncio.timeout(self.machine.round_budget(now, self.retry_period)):
                await self._round(now)
        except LeaseConflict:
            log.info("lease conflict: another replica wrote first", extra={"identity": self.identity})
            self.machine.lost()
        except Exception as e:  # the API being down must not crash the loop: the deadline decides
            log.warning("lease round failed: %r", e, extra={"identity": self.identity})
        await self._publish()

    async def _round(self, now: float) -> None:
        """Bounded by `round_budget`, so a hung API call cannot keep a stale `leading` flag up
        past the renew deadline, while a slow API server (a second per request) still renews:
        bounded by the retry period, such rounds timed out and the replica stopped leading."""
        got = await self.store.get()
        current, rv = (got[0], got[1]) if got else (None, None)
        self._current, self._resource_version = current, rv
        step = self.machine.step(current, now)
        if step.action is Action.create:
            assert step.record is not None
            await self.store.create(step.record)
            self.machine.written(step.record, now)
        elif step.action in (Action.acquire, Action.renew):
            assert step.record is not None and rv is not None
            await self.store.update(step.record, rv)
            self.machine.written(step.record, now)
            if step.action is Action.acquire:
                log.info(
                    "acquired lease",
                    extra={"identity": self.identity, "transitions": step.record.transitions},
                )

    async def _publish(self) -> None:
        leading_now = self.is_leader()
        if leading_now and not self.leading.is_set():
            self.leading.set()
            if self._on_started:
                await self._on_started()
        elif not leading_now and self.leading.is_set():
            self.leading.clear()
            log.warning("lost leadership", extra={"identity": self.identity})
            if self._on_stopped:
                await self._on_stopped()

    async def run(self, stop: asyncio.Event) -> None:
        """A round every retry period, counted from the start of the last one (a slow renewal
        does not delay the next), until `stop`."""
        async with contextlib.aclosing(ticks(stop, self.retry_period, self.clock)) as rounds:
            async for _ in rounds:
                await self.tick()

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown (client-go's ReleaseOnCancel)."""
        was_leader = self.is_leader()
        self.machine.lost()
        self.leading.clear()
        if not was_leader:
            return
        try:
            got = await self.store.get()
            if got is None:
                return
            record = self.machine.release_record(got[0])
            if record is not None:
                await self.store.update(record, got[1])
                log.info("released lease", extra={"identity": self.identity})
        except Exception as e:
            log.warning("could not release lease: %s", e)
