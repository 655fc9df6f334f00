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
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import ray

from rljob_client.rayconnect import RayConnectError, init_ray
from rljob_client.trainbatch import ShardRef, TrainBatch, decode

ACTOR_NAMESPACE = "rljob"
CLIENT_PORT = 10001
CONNECT_ATTEMPTS = 4


class RolloutStreamError(RuntimeError):
    """The executor could not produce the shard (its error text is included)."""


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
    ) -> None:
        if transport not in ("auto", "http", "ray"):
            raise ValueError(f"transport {transport!r}: expected auto, http or ray")
        self.job = job
        self.address = address or os.environ.get("RLJOB_ROLLOUT_ADDRESS") or f"ray://{job}-rollout:{CLIENT_PORT}"
        self.timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._data_url_override = data_url or os.environ.get("RLJOB_ROLLOUT_DATA_URL")
        self._transport = transport
        self._actor: Any = None
        self._info: dict[str, Any] = {}
        self._conn: http.client.HTTPConnection | None = None
        self._owns_ray = False

    # ---- connection --------------------------------------------------------------------

    def connect(self) -> RolloutStream:
        if self._actor is not None:
            return self
        deadline = time.monotonic() + self._connect_timeout_s
        if not ray.is_initialized():
            self._init_ray(deadline)
            self._owns_ray = True
        while True:
            try:
                self._actor = ray.get_actor(actor_name(self.job), namespace=ACTOR_NAMESPACE)
                break
            except ValueError:
                if time.monotonic() > deadline:
                    raise RolloutStreamError(
                        f"no executor actor {actor_name(self.job)!r} in namespace {ACTOR_NAMESPACE!r} at {self.address}"
                    ) from None
                time.sleep(0.5)
        self._info = ray.get(self._actor.ready.remote(), timeout=self._connect_timeout_s)
        return self

    def _init_ray(self, deadline: float) -> None:
        """ray.init, retried (rljob_client.rayconnect): the client server's per-connection server
        can die at start (seen under gVisor: a gRPC epoll check failure, and with KubeRay's head)."""
        try:
            init_ray(self.address, ACTOR_NAMESPACE, deadline, CONNECT_ATTEMPTS, log_to_driver=False)
        except RayConnectError as e:
            raise RolloutStreamError(str(e)) from e

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
        ray.get(self.actor.generate.remote(rollout_id), timeout=self._connect_timeout_s)

    def get(self, rollout_id: int, rank: int | None = None, world_size: int | None = None) -> TrainBatch:
        """This rank's shard (rank/world_size default to $RANK/$WORLD_SIZE); waits for generation."""
        env_rank, env_world = _env_rank()
        rank = env_rank if rank is None else rank
        world_size = env_world if world_size is None else world_size
        self.connect()
        if self.transport == "http":
            return self._get_http(rollout_id, rank, world_size)
        return self.get_ref_batch(self.get_ref(rollout_id, rank, world_size))

    def get_ref(self, rollout_id: int, rank: int, world_size: int) -> ShardRef:
        """The object-store reference of a shard (no bulk bytes move)."""
        try:
            return ray.get(self.actor.get.remote(rollout_id, rank, world_size), timeout=self.timeout_s)
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
                raise RolloutStreamError(f"shard {rank}/{world_size} of rollout {rollout_id}: connection closed at {got}/{length} bytes")
            got += n
        return decode(buf)

    # ---- the executor's other calls ----------------------------------------------------

    def set_weight_version(self, version: int | str) -> int:
        return ray.get(self.actor.set_weight_version.remote(version), timeout=self._connect_timeout_s)

    def begin_weight_update(self) -> dict[str, Any]:
        return ray.get(self.actor.begin_weight_update.remote(), timeout=self.timeout_s)

    def end_weight_update(self, version: int | str | None = None) -> int:
        return ray.get(self.actor.end_weight_update.remote(version), timeout=self._connect_timeout_s)

    def eval(self, rollout_id: int, weight_version: int | str | None = None, checkpoint: str | None = None) -> dict[str, Any]:
        """Evaluate at eval point `rollout_id` (with spec.rollout.eval: the policy after that many steps,
        on the eval fleet re-pinned to `checkpoint` if the job has one, else on the policy fleet);
        the executor records status.lastEval. Keys: skipped, reason, mean_reward, pass_at_1, n, ..."""
        version = None if weight_version is None else str(weight_version)
        return ray.get(self.actor.eval.remote(rollout_id, version, checkpoint), timeout=self.timeout_s)

    @property
    def eval_every_steps(self) -> int:
        """spec.rollout.eval.everySteps as the executor has it (0: no evaluation of the policy)."""
        return int(self.connect()._info.get("eval_every_steps") or 0)

    def save(self, rollout_id: int) -> str:
        return ray.get(self.actor.save.remote(rollout_id), timeout=self._connect_timeout_s)

    def load(self) -> int | None:
        return ray.get(self.actor.load.remote(), timeout=self._connect_timeout_s)

    def checkpoint(self, rollout_id: int) -> dict[str, Any]:
        """The executor's state after `rollout_id` (dataset position, pending rollouts), for a trainer checkpoint."""
        return ray.get(self.actor.checkpoint.remote(rollout_id), timeout=self._connect_timeout_s)

    def restore(self, state: dict[str, Any]) -> int:
        """Put the executor back to a trainer checkpoint's `checkpoint()` state; returns its rollout id."""
        return ray.get(self.actor.restore.remote(state), timeout=self._connect_timeout_s)

    def stats(self) -> dict[str, Any]:
        return ray.get(self.actor.stats.remote(), timeout=self._connect_timeout_s)
