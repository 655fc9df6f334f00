"""The shard side channel: trainer ranks fetch their shard's bytes over plain HTTP.

Why: through Ray Client every object byte is proxied over gRPC by the client server
(measured here ~45-115 MiB/s), while a direct driver maps the object store (~170-540 MiB/s).
The shard stays in the object store; this server, inside the actor, reads it there
(zero-copy) and writes it to the socket in the `rljob_client.trainbatch` format, which the
trainer maps with `np.frombuffer`. Ray Client is still how a trainer finds the actor and
learns this URL and its bearer token (random per actor), so only someone who can reach the
actor can read batches.

    GET /v1/rollouts/{rollout_id}/shards/{rank}?world_size=W   Authorization: Bearer <token>
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from rljob_client.trainbatch import TrainBatch, encode, encoded_size

log = logging.getLogger(__name__)

ShardSource = Callable[[int, int, int], Awaitable[TrainBatch]]
CHUNK = 4 << 20


class DataChannel:
    def __init__(self, source: ShardSource, token: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self._source = source
        self._token = token
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/v1/rollouts/{rollout_id}/shards/{rank}", self._shard)
        app.router.add_get("/healthz", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _shard(self, req: web.Request) -> web.StreamResponse:
        auth = req.headers.get("Authorization", "")
        if not hmac.compare_digest(auth.encode(), f"Bearer {self._token}".encode()):
            return web.json_response({"error": "bad or missing bearer token"}, status=401)
        try:
            rollout_id = int(req.match_info["rollout_id"])
            rank = int(req.match_info["rank"])
            world_size = int(req.query.get("world_size", "1"))
        except ValueError:
            return web.json_response({"error": "rollout_id, rank and world_size must be integers"}, status=400)
        if world_size < 1 or not 0 <= rank < world_size:
            return web.json_response({"error": f"rank {rank} is not in a world of size {world_size}"}, status=400)
        try:
            shard = await self._source(rollout_id, rank, world_size)
        except Exception as e:
            log.exception("shard %d/%d of rollout %d failed", rank, world_size, rollout_id)
            return web.json_response({"error": f"{type(e).__name__}: {e}", "type": type(e).__name__}, status=500)
        parts = encode(shard)
        resp = web.StreamResponse(
            headers={"Content-Type": "application/x-rljob-trainbatch", "Content-Length": str(encoded_size(parts))}
        )
        await resp.prepare(req)
        for part in parts:
            for i in range(0, part.nbytes, CHUNK):
                await resp.write(part[i : i + CHUNK])
        await resp.write_eof()
        return resp
