"""Polling with a deadline, the one way tests and benchmarks wait for cluster state.

Apart from fixtures.py (a pytest plugin) so that process harnesses that bench/ imports too
(tests/cluster/kuberay.py) can wait without importing pytest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_for(fn: Callable[[], T], timeout: float = 60.0, interval: float = 0.2, what: str = "") -> T:
    """Poll fn() until it returns a truthy value (returned) or the deadline passes.

    Exceptions raised by fn count as "not yet"; the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = fn()
            if value:
                return value
            last = value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what or fn!r}; last: {last!r}")
        time.sleep(interval)


__all__ = ["WaitTimeout", "wait_for"]
