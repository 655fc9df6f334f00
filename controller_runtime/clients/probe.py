"""An engine's health probe made the way the kubelet's HTTP prober makes it: one GET on a new
connection that asks to be closed, the status line and a bounded body read, nothing kept.

Why not the aiohttp session every other engine call uses: a probe is the one engine call the
operator makes all the time (every cell, every `intervalSeconds`), and through aiohttp each one
builds a request, a response, a URL, timer contexts and a connector entry, which makes probes
the bulk of an idle operator's event loop. A probe needs none of it: the answer's status
decides, the body is only the message of a failure.

The failures are the typed ones `EngineHTTP.request` raises, so that the health monitor cannot
tell the two transports apart: no connection or a connection closed before a status line is
`EngineUnavailable`, no answer within the timeout `EngineTimeout`, a reply that is not HTTP
`EngineProtocolError`, a status of 400 or more `EngineHTTPError` with the body.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from controller_runtime.errors import EngineHTTPError, EngineProtocolError, EngineTimeout, EngineUnavailable

BODY_LIMIT = 64 * 1024  # a failure's message needs its first bytes; a larger body is cut here
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})(?: [^\r\n]*)?")


@dataclass(frozen=True)
class Target:
    """Where a probe connects, from the engine's base URL (`http://host:port`)."""

    host: str
    port: int
    authority: str  # the Host header

    @classmethod
    def of(cls, endpoint: str) -> Target:
        parts = urlsplit(endpoint)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"a probe needs an http://host[:port] endpoint, not {endpoint!r}")
        return cls(parts.hostname, parts.port or 80, parts.netloc)


@dataclass(frozen=True)
class Reply:
    """An HTTP answer as far as a probe reads it."""

    status: int
    body: bytes


def parse_reply(data: bytes, complete: bool) -> Reply | None:
    """The reply in `data` once it is whole (None: wait for more), or `EngineProtocolError`'s
    message as a ValueError when `data` is not an HTTP/1.x reply. `complete`: the server closed
    the connection, so what came is all that will come."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        if complete or len(data) > BODY_LIMIT:
            raise ValueError(f"no HTTP reply head in {data[:80]!r}")
        return None
    head = data[:head_end].split(b"\r\n")
    status = _STATUS_LINE.fullmatch(head[0])
    if status is None:
        raise ValueError(f"bad status line {head[0][:80]!r}")
    headers = {}
    for line in head[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    body = data[head_end + 4 :]
    length = headers.get(b"content-length")
    chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
    if length is not None and not chunked:
        try:
            size = int(length)
        except ValueError as exc:
            raise ValueError(f"bad Content-Length {length[:40]!r}") from exc
        if len(body) < min(size, BODY_LIMIT) and not complete:
            return None
        body = body[:size]
    elif not complete and len(body) < BODY_LIMIT:
        return None  # chunked or unframed: the server's close ends it (we asked for one)
    if chunked:
        body = dechunk(body)
    return Reply(int(status.group(1)), body[:BODY_LIMIT])


def dechunk(body: bytes) -> bytes:
    """The data of a chunked body, as far as it goes (a cut body keeps what came whole)."""
    out, rest = bytearray(), body
    while True:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            break
        try:
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
        except ValueError:
            break
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2 :]
    return bytes(out)


class _ProbeProtocol(asyncio.Protocol):
    """Send the request when connected, gather the answer, settle `answer` once."""

    def __init__(self, request: bytes, answer: asyncio.Future[Reply]) -> None:
        self.request, self.answer = request, answer
        self.data = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.data += data
        self._settle(complete=False)

    def eof_received(self) -> bool | None:
        self._settle(complete=True)
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._settle(complete=True, lost=exc)

    def _settle(self, complete: bool, lost: Exception | None = None) -> None:
        if self.answer.done():
            return
        if complete and not self.data:
            self.answer.set_exception(ConnectionResetError(str(lost) if lost else "server disconnected"))
            return
        try:
            reply = parse_reply(bytes(self.data), complete)
        except ValueError as exc:
            self.answer.set_exception(exc)
        else:
            if reply is None:
                return
            self.answer.set_result(reply)
        if self.transport is not None:
            self.transport.close()


async def probe(endpoint: str, path: str, timeout_s: float, target: Target | None = None) -> Reply:
    """GET `path` of the engine at `endpoint` on a connection of its own, closed after the reply;
    a reply of status < 400, or the typed error `EngineHTTP.request` raises for the same failure.
    `target`: `endpoint` parsed already (a client probes the same engine every interval)."""
    what = f"GET {path}"
    target = target or Target.of(endpoint)
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {target.authority}\r\nUser-Agent: rljob-probe\r\n"
        "Accept: */*\r\nConnection: close\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Reply] = loop.create_future()
    transport: asyncio.Transport | None = None
    try:
        async with asyncio.timeout(timeout_s):
            transport, _ = await loop.create_connection(
                lambda: _ProbeProtocol(request, answer), target.host, target.port
            )
            reply = await answer
    except TimeoutError as exc:
        raise EngineTimeout(endpoint, f"{what}: no answer within {timeout_s:g}s") from exc
    except ValueError as exc:
        raise EngineProtocolError(endpoint, f"{what}: malformed reply: {exc}") from exc
    except OSError as exc:  # refused, reset, unreachable; a close before any reply
        raise EngineUnavailable(endpoint, f"{what}: {exc or type(exc).__name__}") from exc
    finally:
        if not answer.done():
            answer.cancel()  # a late answer after a timeout is dropped, not left unretrieved
        if transport is not None and not transport.is_closing():
            transport.abort()
    if reply.status >= 400:
        raise EngineHTTPError(endpoint, reply.status, reply.body.decode(errors="replace"))
    return reply
