"""Trainer side of the rollout stream: this rank's share of each rollout, from the executor actor.

    stream = RolloutStream("my-job")                      # ray://my-job-rollout:10001
    stream.generate(step + 1)                             # optional: overlap the next rollout
    batch = stream.get(step, rank, world_size)            # TrainBatch (numpy arrays)
    stream.set_weight_version(step + 1)

Shards are whole GRPO groups, disjoint across ranks and together the whole rollout.

Transports (`transport=`):
- `"http"`: the shard's bytes come over the actor's HTTP side channel (URL and bearer token
  learnt from the actor over Ray Client) and are mapped with `np.frombuffer` (no copy).
  Ray Client proxies every object byte over gRPC; this path does not.
- `"ray"`: `ray.get` of the ObjectRef the actor returns: zero-copy for a driver on a Ray
  node, proxied (slow) through Ray Client.
- `"auto"` (default): `"ray"` when this process is a driver on a Ray node (not Ray Client),
  else `"http"`.
Address: `address=`, else $RLJOB_ROLLOUT_ADDRESS, else `ray://<job>-rollout:10001`; an already
initialised Ray connection is reused. `data_url=` (or $RLJOB_ROLLOUT_DATA_URL) overrides the
side channel's advertised URL, e.g. `http://<job>-rollout:10002` behind a Service.

A replaced executor (its pod deleted, the Deployment's new one up): any call that finds the
executor gone (Ray Client's session broken, the actor dead, the side channel's socket reset)
reconnects to the new one and is made again, retrying until a deadline (`reconnect_timeout_s`,
$RLJOB_ROLLOUT_RECONNECT_SECONDS, 600 s) rather than for a number of attempts, and fails with
a RolloutStreamError naming the address and the last error when it passes. The new executor
resumes its saved dataset position (its state dir, which the operator puts on the shared
weights volume) and is told the weight version this stream last set, so no prompt is trained
twice across the replacement.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import ray
import ray.exceptions

from rljob_client.errors import RLJobError
from rljob_client.retry_deadline import DeadlineExpired, retry_until
from rljob_client.wire.trainbatch import ShardRef, TrainBatch, decode

ACTOR_NAMESPACE = "rljob"
CLIENT_PORT = 10001
RECONNECT_SECONDS = 600.0  # a replaced executor pod: scheduling, a Ray head's start, the actor
T = TypeVar("T")
log = logging.getLogger(__name__)


class RolloutStreamError(RLJobError, RuntimeError):
    """The executor could not produce the shard (its error text is included)."""


class ActorMissing(RLJobError, LookupError):
    """The Ray cluster answers but has no executor actor (yet: a new executor creates it after its head)."""


class ShardChannelLost(RLJobError, ConnectionError):
    """The side channel closed mid-shard: the executor went away while sending it."""


# What a replaced executor looks like from here: Ray Client's broken or refused session
# (ConnectionError), the actor killed with its pod (RayActorError), the side channel's socket
# reset or unroutable (OSError, HTTPException), the actor not yet created by the new pod.
EXECUTOR_LOST: tuple[type[BaseException], ...] = (
    ConnectionError, OSError, http.client.HTTPException, ray.exceptions.RayActorError, ActorMissing,
)
# ...but not these, though Ray makes them OSErrors too: the actor's own error (a RayTaskError is
# also an instance of its cause's type) and a call that outlived its timeout on a live executor.
NOT_LOST: tuple[type[BaseException], ...] = (ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError)


def actor_name(job: str) -> str:
    return f"rljob-executor-{job}"


def _env_rank() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class RolloutStream:
    def __init__(
        self,
        job: str,
        address: str | None = None,
        *,
        transport: str = "auto",
        data_url: str | None = None,
        timeout_s: float = 3600.0,
        connect_timeout_s: float = 120.0,
        reconnect_timeout_s: float | None = None,
    ) -> None:
        if transport not in ("auto", "http", "ray"):
            raise ValueError(f"transport {transport!r}: expected auto, http or ray")
        self.job = job
        self.address = address or os.environ.get("RLJOB_ROLLOUT_ADDRESS") or f"ray://{job}-rollout:{CLIENT_PORT}"
        self.timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self.reconnect_timeout_s = (reconnect_timeout_s if reconnect_timeout_s is not None
                                    else float(os.environ.get("RLJOB_ROLLOUT_RECONNECT_SECONDS", RECONNECT_SECONDS)))
        self._data_url_override = data_url or os.environ.get("RLJOB_ROLLOUT_DATA_URL")
        self._transport = transport
        self._actor: Any = None
        self._info: dict[str, Any] = {}
        self._conn: http.client.HTTPConnection | None = None
        self._owns_ray = False
        self._lock = threading.RLock()
        self._generation = 0  # bumped by each reconnect
        self._weight_version: int | str | None = None  # the last one set: a replaced executor is told it again
        self.reconnects = 0

    # ---- connection --------------------------------------------------------------------

    def connect(self) -> RolloutStream:
        if self._actor is not None:
            return self
        with self._lock:
            if self._actor is None:
                self._connect_within(self._connect_timeout_s, "connecting to the executor")
        return self

    def _connect_within(self, seconds: float, what: str) -> None:
        """(Re)connect: Ray Client if this stream owns the connection, the named actor, its ready()
        info (data channel URL and token: a new actor has new ones), all under one deadline."""

        def once() -> None:
            if not ray.is_initialized():
                self._owns_ray = True  # before init: a failed init is shut down before the next try
                ray.init(address=self.address, namespace=ACTOR_NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
            try:
                actor = ray.get_actor(actor_name(self.job), namespace=ACTOR_NAMESPACE)
            except ValueError as e:
                raise ActorMissing(f"no executor actor {actor_name(self.job)!r} in namespace {ACTOR_NAMESPACE!r} at {self.address}") from e
            info: dict[str, Any] = ray.get(actor.ready.remote(), timeout=self._connect_timeout_s)  # type: ignore[assignment]
            self._info = info
            if self._weight_version is not None:  # a replaced executor starts at its saved version
                ray.get(actor.set_weight_version.remote(self._weight_version), timeout=self._connect_timeout_s)
            self._actor = actor

        def between(attempt: int, exc: BaseException) -> None:
            log.info("%s at %s: attempt %d failed (%s: %s); retrying", what, self.address, attempt, type(exc).__name__, exc)
            if self._owns_ray:  # a broken client session cannot be reused: the next try starts a fresh one
                self._shutdown_ray()

        try:
            retry_until(once, seconds=seconds, retry_on=EXECUTOR_LOST, what=f"{what} at {self.address}", on_retry=between)
        except DeadlineExpired as e:
            raise RolloutStreamError(str(e)) from e

    def _shutdown_ray(self) -> None:
        with contextlib.suppress(Exception):
            ray.shutdown()
        self._owns_ray = False

    def _reconnect(self, seen: int, cause: BaseException, seconds: float) -> None:
        """The executor was lost (its pod replaced): connect to its successor within `seconds`.

        `seen` is the connection generation the failed call used: of several threads that saw
        one loss, the first reconnects and the others reuse its connection."""
        with self._lock:
            if self._generation != seen:
                return
            started = time.monotonic()
            log.warning("executor lost (%s: %s); reconnecting to %s (deadline %g s)", type(cause).__name__, cause,
                        self.address, self.reconnect_timeout_s)
            self._actor = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._owns_ray:
                self._shutdown_ray()
            self._connect_within(seconds, "reconnecting to the executor")
            self._generation += 1
            self.reconnects += 1
            log.warning("reconnected to the executor at %s after %.1f s (data channel %s)", self.address,
                        time.monotonic() - started, self._info.get("data_url"))

    def _call(self, fn: Callable[[], T]) -> T:
        """`fn()` against the executor; when the executor is lost mid-call, reconnect and call again.

        Every call the trainer makes is safe to repeat: a shard is the same shard until all
        ranks took it, and a replaced executor resumes its saved dataset position."""
        lost_at: float | None = None
        while True:
            self.connect()
            seen = self._generation
            try:
                return fn()
            except EXECUTOR_LOST as e:
                if isinstance(e, NOT_LOST):
                    raise
                lost_at = time.monotonic() if lost_at is None else lost_at
                left = self.reconnect_timeout_s - (time.monotonic() - lost_at)
                if left <= 0:
                    raise RolloutStreamError(f"the executor at {self.address} was lost and did not come back within "
                                             f"{self.reconnect_timeout_s:g} s: {type(e).__name__}: {e}") from e
                self._reconnect(seen, e, left)

    @property
    def transport(self) -> str:
        if self._transport != "auto":
            return self._transport
        return "http" if ray.util.client.ray.is_connected() else "ray"

    @property
    def actor(self) -> Any:
        return self.connect()._actor

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._actor = None
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> RolloutStream:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- batches -----------------------------------------------------------------------

    def generate(self, rollout_id: int) -> None:
        """Start generating a rollout in the background (returns at once)."""
        self._call(lambda: ray.get(self._actor.generate.remote(rollout_id), timeout=self._connect_timeout_s))

    def get(self, rollout_id: int, rank: int | None = None, world_size: int | None = None) -> TrainBatch:
        """This rank's shard (rank/world_size default to $RANK/$WORLD_SIZE); waits for generation."""
        env_rank, env_world = _env_rank()
        rank = env_rank if rank is None else rank
        world_size = env_world if world_size is None else world_size
        self.connect()
        if self.transport == "http":
            return self._call(lambda: self._get_http(rollout_id, rank, world_size))
        return self._call(lambda: self.get_ref_batch(self._get_ref(rollout_id, rank, world_size)))

    def _get_ref(self, rollout_id: int, rank: int, world_size: int) -> ShardRef:
        try:
            return ray.get(self._actor.get.remote(rollout_id, rank, world_size), timeout=self.timeout_s)
        except ray.exceptions.RayTaskError as e:
            raise RolloutStreamError(str(e.cause if e.cause is not None else e)) from e

    def get_ref_batch(self, ref: ShardRef) -> TrainBatch:
        return ray.get(ref.ref, timeout=self.timeout_s)

    def _http(self) -> tuple[http.client.HTTPConnection, str]:
        url = self._data_url_override or self._info.get("data_url")
        if not url:
            raise RolloutStreamError("the executor advertises no data channel; use transport='ray'")
        parts = urlsplit(url)
        if self._conn is None:
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=self.timeout_s)
            conn.connect()
            with contextlib.suppress(OSError):  # big reads per wake-up; the kernel caps it
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            self._conn = conn
        return self._conn, parts.path.rstrip("/")

    def _get_http(self, rollout_id: int, rank: int, world_size: int) -> TrainBatch:
        path = f"/v1/rollouts/{int(rollout_id)}/shards/{int(rank)}?world_size={int(world_size)}"
        headers = {"Authorization": f"Bearer {self._info.get('token', '')}"}
        for attempt in (0, 1):
            conn, prefix = self._http()
            try:
                conn.request("GET", prefix + path, headers=headers)
                resp = conn.getresponse()
                break
            except (ConnectionError, http.client.HTTPException, OSError):
                conn.close()
                self._conn = None  # a kept-alive socket the server closed: reconnect once
                if attempt:
                    raise
        if resp.status != 200:
            body = resp.read()
            try:
                msg = json.loads(body).get("error", body.decode(errors="replace"))
            except ValueError:
                msg = body.decode(errors="replace")
            raise RolloutStreamError(f"shard {rank}/{world_size} of rollout {rollout_id}: HTTP {resp.status}: {msg}")
        length = int(resp.getheader("Content-Length") or 0)
        buf = bytearray(length)
        view = memoryview(buf)
        got = 0
        while got < length:
            n = resp.readinto(view[got:])
            if not n:
                raise ShardChannelLost(f"shard {rank}/{world_size} of rollout {rollout_id}: connection closed at {got}/{length} bytes")
            got += n
        return decode(buf)

    # ---- the executor's other calls ----------------------------------------------------

    def set_weight_version(self, version: int | str) -> int:
        out = self._call(lambda: ray.get(self._actor.set_weight_version.remote(version), timeout=self._connect_timeout_s))
        self._weight_version = version
        return out

    def begin_weight_update(self) -> dict[str, Any]:
        return self._call(lambda: ray.get(self._actor.begin_weight_update.remote(), timeout=self.timeout_s))

    def end_weight_update(self, version: int | str | None = None) -> int:
        out = self._call(lambda: ray.get(self._actor.end_weight_update.remote(version), timeout=self._connect_timeout_s))
        if version is not None:
            self._weight_version = version
        return out

    def eval(self, rollout_id: int, weight_version: int | str | None = None, checkpoint: str | None = None) -> dict[str, Any]:
        """Evaluate at eval point `rollout_id` (with spec.rollout.eval: the policy after that many steps,
        on the eval fleet re-pinned to `checkpoint` if the job has one, else on the policy fleet);
        the executor records status.lastEval. Keys: skipped, reason, mean_reward, pass_at_1, n, ..."""
        version = None if weight_version is None else str(weight_version)
        return self._call(lambda: ray.get(self._actor.eval.remote(rollout_id, version, checkpoint), timeout=self.timeout_s))

    @property
    def eval_every_steps(self) -> int:
        """spec.rollout.eval.everySteps as the executor has it (0: no evaluation of the policy)."""
        return int(self.connect()._info.get("eval_every_steps") or 0)

    def save(self, rollout_id: int) -> str:
        return self._call(lambda: ray.get(self._actor.save.remote(rollout_id), timeout=self._connect_timeout_s))

    def load(self) -> int | None:
        return self._call(lambda: ray.get(self._actor.load.remote(), timeout=self._connect_timeout_s))

    def checkpoint(self, rollout_id: int) -> dict[str, Any]:
        """The executor's state after `rollout_id` (dataset position, pending rollouts), for a trainer checkpoint."""
        return self._call(lambda: ray.get(self._actor.checkpoint.remote(rollout_id), timeout=self._connect_timeout_s))

    def restore(self, state: dict[str, Any]) -> int:
        """Put the executor back to a trainer checkpoint's `checkpoint()` state; returns its rollout id."""
        return self._call(lambda: ray.get(self._actor.restore.remote(state), timeout=self._connect_timeout_s))

    def stats(self) -> dict[str, Any]:
        return self._call(lambda: ray.get(self._actor.stats.remote(), timeout=self._connect_timeout_s))
