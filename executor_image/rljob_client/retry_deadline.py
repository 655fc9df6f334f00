"""Retrying a call until a deadline, not a number of attempts.

Why a deadline: how long a peer takes to come back is a matter of time, not of tries. A
replaced executor pod is scheduled, starts a Ray head and creates its actor in tens of
seconds (minutes on a loaded node), while one failed `ray.init` may take 30 s or return at
once (connection refused): a count of attempts is either far too short or far too long. The
error when the deadline passes names what was tried, for how long, and the last failure.

Pure: the clock and the sleep are parameters, so a test runs it without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from rljob_client.errors import RLJobError

T = TypeVar("T")


class DeadlineExpired(RLJobError, RuntimeError):
    """The call kept failing until the deadline; `last` is its final error."""

    def __init__(self, what: str, attempts: int, elapsed: float, seconds: float, last: BaseException) -> None:
        super().__init__(
            f"{what}: gave up after {attempts} attempts in {elapsed:.0f} s "
            f"(deadline {seconds:g} s); last error: {type(last).__name__}: {last}"
        )
        self.attempts = attempts
        self.elapsed = elapsed
        self.seconds = seconds
        self.last = last


def retry_until(
    call: Callable[[], T],
    *,
    seconds: float,
    retry_on: tuple[type[BaseException], ...],
    what: str,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
    first_wait: float = 0.5,
    max_wait: float = 5.0,
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    """`call()` until it returns; an error in `retry_on` is retried (waits doubling from
    `first_wait` to `max_wait`, never past the deadline) until `seconds` have passed, then
    DeadlineExpired. Any other error is raised at once. `on_retry(attempt, error)` runs
    before each wait (cleanup between tries, logging). `clock`/`sleep` default to the `time`
    module's, looked up at call time."""
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    start = clock()
    deadline = start + seconds
    attempt = 0
    wait = first_wait
    while True:
        attempt += 1
        try:
            return call()
        except retry_on as exc:
            now = clock()
            if now >= deadline:
                raise DeadlineExpired(what, attempt, now - start, seconds, exc) from exc
            if on_retry is not None:
                on_retry(attempt, exc)
            sleep(min(wait, max(0.0, deadline - now)))
            wait = min(wait * 2, max_wait)
