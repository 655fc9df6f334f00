"""The trainer's link to the executor survives the executor's replacement (issue 12).

A replaced executor pod takes tens of seconds to minutes to be back (scheduling, a Ray head,
the actor), so `RolloutStream` retries until a deadline, not for four attempts, and a call
that finds the executor gone reconnects and is made again. Ray is faked at its module
functions (no cluster, no sockets) and time at the `time` module, so nothing here waits.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray
import ray.exceptions
from rljob_client import rollout_stream as rs
from rljob_client.retry_deadline import DeadlineExpired, retry_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(time, "monotonic", c.monotonic)
    monkeypatch.setattr(time, "sleep", c.sleep)
    return c


# ---- retry_until ------------------------------------------------------------------------


def test_retry_until_keeps_trying_until_the_call_succeeds_within_the_deadline(clock: FakeClock) -> None:
    calls = []

    def flaky() -> str:
        calls.append(clock.now)
        if len(calls) < 12:
            raise ConnectionError("refused")
        return "ok"

    assert retry_until(flaky, seconds=120, retry_on=(ConnectionError,), what="x") == "ok"
    assert len(calls) == 12
    assert max(clock.waits) == 5.0  # doubling waits, capped


def test_retry_until_gives_up_at_the_deadline_naming_the_call_and_its_last_error(clock: FakeClock) -> None:
    def refused() -> None:
        clock.now += 3.0  # each attempt itself takes time
        raise ConnectionError("connection refused")

    start = clock.now
    with pytest.raises(DeadlineExpired) as info:
        retry_until(
            refused, seconds=60, retry_on=(ConnectionError,), what="connecting to ray://job-rollout:10001"
        )
    msg = str(info.value)
    assert "connecting to ray://job-rollout:10001" in msg
    assert "deadline 60 s" in msg and "ConnectionError: connection refused" in msg
    assert 60 <= clock.now - start < 60 + 3.0 + 5.0  # no wait ran past the deadline
    assert info.value.attempts > 4


def test_retry_until_raises_other_errors_at_once(clock: FakeClock) -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise KeyError("not retryable")

    with pytest.raises(KeyError):
        retry_until(broken, seconds=60, retry_on=(ConnectionError,), what="x")
    assert calls == [1]


# ---- RolloutStream against a faked Ray ---------------------------------------------------


class FakeMethod:
    def __init__(self, actor: FakeActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> tuple[FakeActor, str, tuple[Any, ...]]:
        return (self.actor, self.name, args)


class FakeActor:
    """An executor actor; `dead` makes every call fail as a killed actor's does."""

    def __init__(self, incarnation: int) -> None:
        self.incarnation = incarnation
        self.dead = False
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> FakeMethod:
        return FakeMethod(self, name)


class FakeRay:
    """Ray Client as the stream sees it: init may be refused, the actor is looked up by name."""

    def __init__(self, clock: FakeClock, refusals: int = 0) -> None:
        self.clock = clock
        self.refusals = refusals
        self.initialized = False
        self.inits = 0
        self.shutdowns = 0
        self.actors: list[FakeActor] = [FakeActor(0)]

    def init(self, **kwargs: Any) -> None:
        self.inits += 1
        self.clock.now += 5.0  # a refused Ray Client connect takes seconds
        if self.refusals > 0:
            self.refusals -= 1
            raise ConnectionError("ray client connection timeout")
        self.initialized = True

    def is_initialized(self) -> bool:
        return self.initialized

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.initialized = False

    def get_actor(self, name: str, namespace: str) -> FakeActor:
        if not self.initialized:
            raise ConnectionError("not connected")
        return self.actors[-1]

    def get(self, ref: tuple[FakeActor, str, tuple[Any, ...]], timeout: float | None = None) -> Any:
        actor, name, args = ref
        if actor.dead:
            raise ray.exceptions.RayActorError()
        actor.calls.append((name, args))
        if name == "ready":
            return {"data_url": f"http://10.0.0.{actor.incarnation}:10002", "token": "t"}
        if name == "stats":
            return {"incarnation": actor.incarnation}
        return args[0] if args else None

    def replace_executor(self) -> FakeActor:
        """The old pod's actor is gone; a new pod holds a new one."""
        self.actors[-1].dead = True
        self.actors.append(FakeActor(len(self.actors)))
        return self.actors[-1]


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> FakeRay:
    f = FakeRay(clock)
    for name in ("init", "is_initialized", "shutdown", "get_actor", "get"):
        monkeypatch.setattr(ray, name, getattr(f, name))
    return f


def test_connect_outlasts_more_than_four_refused_attempts_within_its_deadline(fake_ray: FakeRay) -> None:
    """The old stream gave up after 4 ray.init attempts: too few for a pod being recreated."""
    fake_ray.refusals = 10  # ~50 s of refusals, well inside the 120 s deadline
    stream = rs.RolloutStream("job", "ray://job-rollout:10001", transport="http", connect_timeout_s=120)
    stream.connect()
    assert fake_ray.inits == 11
    assert stream._info["data_url"] == "http://10.0.0.0:10002"


def test_connect_fails_at_its_deadline_with_an_error_naming_the_address(fake_ray: FakeRay) -> None:
    fake_ray.refusals = 10**6
    stream = rs.RolloutStream("job", "ray://job-rollout:10001", transport="http", connect_timeout_s=120)
    with pytest.raises(
        rs.RolloutStreamError, match=r"ray://job-rollout:10001.*deadline 120 s.*ConnectionError"
    ):
        stream.connect()


def test_a_call_that_finds_the_executor_replaced_reconnects_and_is_made_again(fake_ray: FakeRay) -> None:
    stream = rs.RolloutStream("job", "ray://job-rollout:10001", transport="http", reconnect_timeout_s=300)
    assert stream.set_weight_version(3) == 3
    new = fake_ray.replace_executor()
    fake_ray.refusals = 8  # the new pod's Ray Client server is not up yet for a while
    assert stream.stats() == {"incarnation": 1}
    assert stream.reconnects == 1
    assert fake_ray.shutdowns >= 1  # the broken session was dropped before the new one
    assert stream._info["data_url"] == "http://10.0.0.1:10002"  # the new pod's side channel
    # The new executor was told the weight version before the call was made again.
    assert new.calls[:3] == [("ready", ()), ("set_weight_version", (3,)), ("stats", ())]


def test_a_replaced_executor_that_never_comes_back_fails_the_call_at_the_deadline(fake_ray: FakeRay) -> None:
    stream = rs.RolloutStream("job", "ray://job-rollout:10001", transport="http", reconnect_timeout_s=90)
    stream.connect()
    fake_ray.replace_executor()
    fake_ray.refusals = 10**6
    with pytest.raises(
        rs.RolloutStreamError, match=r"reconnecting to the executor at ray://job-rollout:10001.*deadline"
    ):
        stream.stats()


def test_an_error_raised_by_the_actor_itself_is_not_retried(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = rs.RolloutStream("job", "ray://job-rollout:10001", transport="http")
    stream.connect()
    err = ray.exceptions.RayTaskError("stats", "Traceback", OSError("disk full")).as_instanceof_cause()
    assert isinstance(err, OSError)  # Ray makes it an instance of its cause's type too

    def failing(ref: Any, timeout: float | None = None) -> Any:
        raise err

    monkeypatch.setattr(ray, "get", failing)
    with pytest.raises(ray.exceptions.RayTaskError):
        stream.stats()
    assert stream.reconnects == 0


def test_a_call_that_times_out_on_a_live_executor_is_not_taken_for_a_lost_one(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = rs.RolloutStream("job", "ray://job-rollout:10001", transport="http")
    stream.connect()
    assert isinstance(ray.exceptions.GetTimeoutError(), OSError)

    def slow(ref: Any, timeout: float | None = None) -> Any:
        raise ray.exceptions.GetTimeoutError("Get timed out")

    monkeypatch.setattr(ray, "get", slow)
    with pytest.raises(ray.exceptions.GetTimeoutError):
        stream.stats()
    assert stream.reconnects == 0
