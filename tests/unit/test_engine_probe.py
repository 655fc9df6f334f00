"""The health probe without aiohttp (`controller_runtime.clients.probe`): the same answers and
the same typed failures as `EngineHTTP.request`, against real loopback servers.

An aiohttp server answers the well-formed cases; a raw asyncio server plays the engines that
misbehave (silent, cut off, not HTTP), as a hung or dying engine does.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from controller_runtime.clients import SGLangClient, VLLMClient
from controller_runtime.clients.http import EngineHTTP
from controller_runtime.clients.probe import BODY_LIMIT, Target, dechunk, parse_reply, probe
from controller_runtime.errors import (
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
)


@asynccontextmanager
async def app_server(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def raw_server(serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> AsyncIterator[str]:
    """`serve` each connection; at the end every connection is closed and every handler done."""
    writers: list[asyncio.StreamWriter] = []
    handlers: list[asyncio.Task[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        task = asyncio.ensure_future(serve(reader, writer))
        handlers.append(task)
        await asyncio.wait([task])

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        for writer in writers:
            writer.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def test_a_healthy_engine_passes_and_sees_a_plain_get_that_asks_to_close() -> None:
    seen: list[tuple[str, str, str | None, str | None]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, request.headers.get("Connection"), request.headers.get("Host")))
        return web.Response(text="")

    async with app_server(answer) as url:
        reply = await probe(url, "/health", 5.0)
    assert reply.status == 200
    port = url.rsplit(":", 1)[1]
    assert seen == [("GET", "/health", "close", f"127.0.0.1:{port}")]


@pytest.mark.parametrize("status", [500, 503])
async def test_an_error_status_is_an_http_error_with_the_body(status: int) -> None:
    async def answer(_: web.Request) -> web.Response:
        return web.Response(status=status, text="engine core died")

    async with app_server(answer) as url:
        with pytest.raises(EngineHTTPError) as err:
            await probe(url, "/health", 5.0)
    assert err.value.status == status
    assert err.value.body == "engine core died"


async def test_a_chunked_error_body_is_read_whole() -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=503)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"not ")
        await resp.write(b"ready")
        await resp.write_eof()
        return resp

    async with app_server(answer) as url:
        with pytest.raises(EngineHTTPError) as err:
            await probe(url, "/health", 5.0)
    assert err.value.body == "not ready"


async def test_a_closed_port_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(EngineUnavailable, match="GET /health"):
            await probe(f"http://127.0.0.1:{port}", "/health", 5.0)


async def test_an_engine_that_never_answers_times_out_within_the_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)  # TCP open, no answer: a SIGSTOPped engine

    async with raw_server(silent) as url:
        with pytest.raises(EngineTimeout, match=r"no answer within 0\.3s"):
            await probe(url, "/health", 0.3)


async def test_a_connection_closed_before_any_reply_is_unavailable() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    async with raw_server(hang_up) as url:
        with pytest.raises(EngineUnavailable):
            await probe(url, "/health", 5.0)


@pytest.mark.parametrize(
    "reply",
    [b"SSH-2.0-OpenSSH_9.6\r\n\r\n", b"HTTP/1.1 2", b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"],
)
async def test_a_reply_that_is_not_http_is_a_protocol_error(reply: bytes) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        writer.close()

    async with raw_server(garbage) as url:
        with pytest.raises(EngineProtocolError, match="malformed reply"):
            await probe(url, "/health", 5.0)


async def test_an_answer_is_taken_when_its_body_is_whole_even_if_the_server_keeps_the_connection() -> None:
    """A server that ignores `Connection: close`: the Content-Length ends the reply, not a hang."""
    async def keeps_open(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndown")
        await writer.drain()
        await asyncio.sleep(30)

    async with raw_server(keeps_open) as url:
        with pytest.raises(EngineHTTPError) as err:
            await probe(url, "/health", 2.0)
    assert (err.value.status, err.value.body) == (503, "down")


@pytest.mark.parametrize("cls, path", [(VLLMClient, "/health"), (SGLangClient, "/health_generate")])
async def test_the_engine_clients_probe_their_health_route_and_fail_alike(
    cls: type[VLLMClient] | type[SGLangClient], path: str
) -> None:
    """Both transports, one failure: the probe's typed error is the one the session's request raises."""
    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=503 if request.path == path else 404, text="down")

    async with app_server(answer) as url, aiohttp.ClientSession(trust_env=False) as session:
        errors: list[EngineHTTPError] = []
        for call in (cls(url, session=session).health(), EngineHTTP(url, session=session).request("GET", path)):
            with pytest.raises(EngineHTTPError) as err:
                await call
            errors.append(err.value)
    assert [(e.status, e.body) for e in errors] == [(503, "down"), (503, "down")]


def test_parse_reply_waits_for_a_whole_reply_and_cuts_a_long_body() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    assert parse_reply(head + b"ab", complete=False) is None
    whole = parse_reply(head + b"abcde", complete=False)
    assert whole is not None and (whole.status, whole.body) == (200, b"abcde")
    unframed = b"HTTP/1.0 503 Busy\r\n\r\n" + b"x" * 10
    assert parse_reply(unframed, complete=False) is None  # ends at the server's close
    done = parse_reply(unframed, complete=True)
    assert done is not None and (done.status, done.body) == (503, b"x" * 10)
    long = parse_reply(b"HTTP/1.1 500 E\r\n\r\n" + b"y" * (BODY_LIMIT + 10), complete=False)
    assert long is not None and len(long.body) == BODY_LIMIT


def test_dechunk_and_target() -> None:
    assert dechunk(b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n") == b"abcde"
    assert dechunk(b"3\r\nab") == b"ab"
    assert Target.of("http://[::1]:8000") == Target("::1", 8000, "[::1]:8000")
    assert Target.of("http://engine-0.j-cells") == Target("engine-0.j-cells", 80, "engine-0.j-cells")
    with pytest.raises(ValueError):
        Target.of("https://10.0.0.1:8000")
