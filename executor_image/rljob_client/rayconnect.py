"""Connecting to a Ray cluster through Ray Client, retried until a deadline.

Both ends of the rollout stream connect to a Ray they did not start: trainers to the
executor's (or the RayCluster's) head, and the executor itself, with `spec.rollout.rayCluster`,
to KubeRay's head. Neither can assume the head is up: its pod starts alongside theirs, and a
Ready pod says nothing about Ray inside it (seen with the real KubeRay: the head took 35 s on
2 busy cores, and its first per-connection client server died at start). A failed attempt is
retried on a fresh connection, with a growing pause, until the deadline or `attempts`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import ray


class RayConnectError(ConnectionError):
    """Ray Client could not connect before the deadline."""


def init_ray(address: str, namespace: str, deadline: float, attempts: int | None = None, **kwargs: Any) -> None:
    """`ray.init(address, namespace, ...)`, retried; `deadline` is a `time.monotonic()` value."""
    attempt = 0
    while True:
        attempt += 1
        try:
            ray.init(address=address, namespace=namespace, logging_level=logging.WARNING, **kwargs)
            return
        except (ConnectionError, ConnectionAbortedError) as e:
            if (attempts is not None and attempt >= attempts) or time.monotonic() > deadline:
                raise RayConnectError(f"cannot connect to {address} after {attempt} attempts: {e}") from e
            with contextlib.suppress(Exception):
                ray.shutdown()
            time.sleep(min(2.0 * attempt, 10.0))
