"""The shard side channel: trainer ranks fetch their shard's bytes over plain HTTP.

Why: through Ray Client every object byte is proxied over gRPC by the client server, several
times slower than a direct driver, which maps the object store.
The shard stays in the object store; this server, inside the actor, reads it there
(zero-copy) and writes it to the socket in the `rljob_client.wire.trainbatch` format, which the
trainer maps with `np.frombuffer`. Ray Client is still how a trainer finds the actor and
learns this URL and its bearer token (random per actor), so only someone who can reach the
actor can read batches.

    GET /v1/rollouts/{rollout_id}/shards/{rank}?world_size=W   Authorization: Bearer <token>
    GET /healthz
    GET /metrics       Prometheus text (rollout_executor.metrics), no token: counts only

A minimal HTTP/1.1 server on asyncio sockets rather than aiohttp: `loop.sock_sendall` sends
slices of the arrays' memory straight to the kernel, where a stream transport would first
copy whatever the socket does not take at once into its own buffer (most of a 16 MiB shard).
Keep-alive, GET only, one request at a time per connection (what http.client does).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

from rljob_client.wire.trainbatch import TrainBatch, encode, encoded_size

log = logging.getLogger(__name__)

ShardSource = Callable[[int, int, int], Awaitable[TrainBatch]]
MAX_HEADER = 16 * 1024
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SOCKET_BUFFER = 8 << 20


class DataChannel:
    def __init__(self, source: ShardSource, token: str, host: str = "127.0.0.1", port: int = 0,
                 metrics: Callable[[], bytes] | None = None) -> None:
        self._source = source
        self._metrics = metrics
        self._auth = f"Bearer {token}".encode()
        self.host = host
        self.port = port
        self._sock: socket.socket | None = None
        self._accept: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(64)
        sock.setblocking(False)
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._accept = asyncio.ensure_future(self._accept_loop(sock))
        return self.port

    async def stop(self) -> None:
        if self._accept is not None:
            self._accept.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accept
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(sock)
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError):  # fewer wake-ups per shard; the kernel caps it
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            task = asyncio.ensure_future(self._serve(conn))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = await loop.sock_recv(conn, 4096)
                    if not chunk:
                        return
                    buf += chunk
                    if len(buf) > MAX_HEADER:
                        await self._reply_json(conn, 431, {"error": "request headers too large"}, close=True)
                        return
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _version = [*lines[0].split(" "), "", ""][:3]
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
                close = headers.get("connection", "").lower() == "close"
                await self._handle(conn, method, target, headers, close)
                if close:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            conn.close()

    async def _handle(self, conn: socket.socket, method: str, target: str, headers: dict[str, str], close: bool) -> None:
        url = urlsplit(target)
        parts = url.path.strip("/").split("/")
        if method != "GET":
            await self._reply_json(conn, 405, {"error": "GET only"}, close)
            return
        if url.path == "/healthz":
            await self._reply_json(conn, 200, {"ok": True}, close)
            return
        if url.path == "/metrics" and self._metrics is not None:
            text = self._metrics()
            await self._send(conn, 200, METRICS_CONTENT_TYPE, len(text), [memoryview(text)], close)
            return
        if len(parts) != 5 or parts[:2] != ["v1", "rollouts"] or parts[3] != "shards":
            await self._reply_json(conn, 404, {"error": f"no route {url.path}"}, close)
            return
        if not hmac.compare_digest(headers.get("authorization", "").encode(), self._auth):
            await self._reply_json(conn, 401, {"error": "bad or missing bearer token"}, close)
            return
        try:
            rollout_id, rank = int(parts[2]), int(parts[4])
            world_size = int(parse_qs(url.query).get("world_size", ["1"])[0])
        except ValueError:
            await self._reply_json(conn, 400, {"error": "rollout_id, rank and world_size must be integers"}, close)
            return
        if world_size < 1 or not 0 <= rank < world_size:
            await self._reply_json(conn, 400, {"error": f"rank {rank} is not in a world of size {world_size}"}, close)
            return
        try:
            shard = await self._source(rollout_id, rank, world_size)
        except Exception as e:
            log.exception("shard %d/%d of rollout %d failed", rank, world_size, rollout_id)
            await self._reply_json(conn, 500, {"error": f"{type(e).__name__}: {e}", "type": type(e).__name__}, close)
            return
        body = encode(shard)
        await self._send(conn, 200, "application/x-rljob-trainbatch", encoded_size(body), body, close)

    async def _reply_json(self, conn: socket.socket, status: int, payload: dict[str, object], close: bool) -> None:
        data = json.dumps(payload).encode()
        await self._send(conn, status, "application/json", len(data), [memoryview(data)], close)

    async def _send(self, conn: socket.socket, status: int, ctype: str, length: int, body: list[memoryview], close: bool) -> None:
        loop = asyncio.get_running_loop()
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large", 500: "Internal Server Error"}
        head = (
            f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\nContent-Type: {ctype}\r\nContent-Length: {length}\r\n"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        ).encode()
        await loop.sock_sendall(conn, head)
        for part in body:
            await loop.sock_sendall(conn, part)
