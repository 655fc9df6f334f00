"""A health probe closes its connection; other engine calls keep theirs (issue 13, operator RSS).

Against a loopback aiohttp server that records, per request, the client's port and the
`Connection` header: two probes through one shared session come from two connections, two
control calls from one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from controller_runtime.clients import SGLangClient, VLLMClient
from controller_runtime.clients.http import EngineHTTP

Seen = list[tuple[str, int, str | None]]  # per request: path, client port, Connection header


@asynccontextmanager
async def engine() -> AsyncIterator[tuple[str, Seen]]:
    seen: Seen = []

    async def answer(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        seen.append((request.path, peer[1] if peer else -1, request.headers.get("Connection")))
        return web.Response(text="{}")

    app = web.Application()
    for path in ("/health", "/health_generate", "/get_model_info"):
        app.router.add_get(path, answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("cls, path", [(VLLMClient, "/health"), (SGLangClient, "/health_generate")])
async def test_each_health_probe_asks_to_close_its_connection(
    cls: type[VLLMClient] | type[SGLangClient], path: str
) -> None:
    async with engine() as (url, seen), aiohttp.ClientSession(trust_env=False) as session:
        client = cls(url, session=session)
        await client.health()
        await client.health()
    probes = [r for r in seen if r[0] == path]
    assert [r[2] for r in probes] == ["close", "close"]
    assert probes[0][1] != probes[1][1], "the second probe reused the first one's connection"


async def test_other_engine_calls_keep_their_connection() -> None:
    async with engine() as (url, seen), aiohttp.ClientSession(trust_env=False) as session:
        http = EngineHTTP(url, session=session)
        await http.request("GET", "/get_model_info")
        await http.request("GET", "/get_model_info")
    calls = [r for r in seen if r[0] == "/get_model_info"]
    assert [r[2] for r in calls] == [None, None]
    assert calls[0][1] == calls[1][1]
