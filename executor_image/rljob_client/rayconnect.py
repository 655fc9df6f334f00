"""Connecting to a Ray cluster through Ray Client, retried until a deadline.

Both ends of the rollout stream connect to a Ray they did not start: trainers to the
executor's (or the RayCluster's) head, and the executor itself, with `spec.rollout.rayCluster`,
to KubeRay's head. Neither can assume the head is up: its pod starts alongside theirs, and a
Ready pod says nothing about Ray inside it (seen with the real KubeRay: the head took 35 s on
2 busy cores, and its first per-connection client server died at start). A failed attempt is
retried on a fresh connection (`retry_deadline.retry_until`) until the deadline.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import ray

from rljob_client.errors import RLJobError
from rljob_client.retry_deadline import DeadlineExpired, retry_until


class RayConnectError(RLJobError, ConnectionError):
    """Ray Client could not connect before the deadline."""


def init_ray(address: str, namespace: str, deadline: float, **kwargs: Any) -> None:
    """`ray.init(address, namespace, ...)`, retried; `deadline` is a `time.monotonic()` value."""

    def once() -> None:
        ray.init(address=address, namespace=namespace, logging_level=logging.WARNING, **kwargs)

    def between(_attempt: int, _exc: BaseException) -> None:
        with contextlib.suppress(Exception):  # a half-made client session is not reused
            ray.shutdown()

    try:
        retry_until(
            once,
            seconds=max(0.0, deadline - time.monotonic()),
            retry_on=(ConnectionError,),
            what=f"connecting to Ray at {address}",
            on_retry=between,
            first_wait=2.0,
            max_wait=10.0,
        )
    except DeadlineExpired as e:
        raise RayConnectError(str(e)) from e
