"""The executor's reading of /v1/completions replies: which answers are the engine's fault
(EngineFailure: retried on another engine) and which reject the request (GenerationError).

The parsing itself is controller_runtime's `parse_completion` (tests/unit/test_engine_replies.py);
these tests pin the executor's error semantics on top of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from rollout_executor.generation import (
    EngineFailure,
    EnginePool,
    GenerationError,
    Generator,
    SamplingParams,
    WeightGate,
    sample_completion,
    static_endpoints,
)
from rollout_executor.samples import SampleKey

URL = "http://engine"
KEY = SampleKey(rollout_id=0, group=1, sample=2)


def reply(**over: object) -> dict[str, Any]:
    choice: dict[str, object] = {
        "index": 0,
        "text": " a b",
        "token_ids": [11, 12],
        "prompt_token_ids": [1, 2, 3],
        "logprobs": {"token_logprobs": [-0.5, -1.5]},
        "finish_reason": "length",
    }
    choice.update(over)
    return {"choices": [choice]}


def test_a_good_reply_keeps_ids_logprobs_and_the_gate_version() -> None:
    c = sample_completion(URL, KEY, reply(), 4, None)
    assert (c.token_ids, c.logprobs, c.prompt_token_ids) == ([11, 12], [-0.5, -1.5], [1, 2, 3])
    assert (c.key, c.engine, c.weight_version, c.text, c.finish_reason) == (KEY, URL, 4, " a b", "length")


def test_the_engine_version_header_overrides_the_gate_version_unless_garbage() -> None:
    assert sample_completion(URL, KEY, reply(), 4, "7").weight_version == 7
    assert sample_completion(URL, KEY, reply(), 4, "seven").weight_version == 4


@pytest.mark.parametrize(
    "data",
    [
        "not json object",
        {"choices": []},
        {"choices": "x"},
        reply(token_ids=None),
        reply(token_ids=["a", "b"]),
        reply(prompt_token_ids=None),
        reply(logprobs=None),
        reply(logprobs={"token_logprobs": [-0.5]}),  # 2 token ids, 1 logprob
        reply(index="first"),
    ],
    ids=["body", "no-choices", "choices-not-list", "no-ids", "bad-ids", "no-prompt-ids", "no-logprobs",
         "length-mismatch", "bad-index"],
)  # fmt: skip
def test_engine_side_garbage_is_an_engine_failure(data: object) -> None:
    with pytest.raises(EngineFailure, match="without token ids/logprobs"):
        sample_completion(URL, KEY, data, 0, None)


def test_an_aborted_request_is_an_engine_failure() -> None:
    with pytest.raises(EngineFailure, match="aborted by the engine"):
        sample_completion(URL, KEY, reply(finish_reason="abort"), 0, None)


Handler = Callable[[web.Request], Any]


@pytest_asyncio.fixture(loop_scope="function")
async def engine() -> AsyncIterator[Callable[[Handler], Any]]:
    """A one-route engine on loopback whose /v1/completions answer the test chooses."""
    servers: list[TestServer] = []
    sessions: list[aiohttp.ClientSession] = []

    async def start(handler: Handler) -> tuple[Generator, list[dict[str, Any]]]:
        seen: list[dict[str, Any]] = []

        async def completions(r: web.Request) -> web.StreamResponse:
            seen.append(await r.json())
            return await handler(r)

        async def models(_r: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "m"}]})

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/v1/models", models)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        session = aiohttp.ClientSession()
        sessions.append(session)
        url = str(server.make_url("")).rstrip("/")
        pool = EnginePool(static_endpoints([url]), concurrency=1)
        gen = Generator(pool, WeightGate(version=2), SamplingParams(max_tokens=2, top_p=0.9), session, max_attempts=1)
        return gen, seen

    yield start
    for s in sessions:
        await s.close()
    for srv in servers:
        await srv.close()


async def test_post_sends_the_shared_request_body_and_parses_the_reply(engine) -> None:
    async def ok(_r: web.Request) -> web.Response:
        return web.json_response(reply(), headers={"X-Weight-Version": "3"})

    gen, seen = await engine(ok)
    c = await gen.complete(KEY, "hi")
    assert (c.token_ids, c.weight_version) == ([11, 12], 3)
    assert seen == [{"model": "m", "prompt": "hi", "max_tokens": 2, "temperature": 1.0, "top_p": 0.9,
                     "n": 1, "logprobs": 0, "return_token_ids": True}]  # fmt: skip


async def test_a_4xx_rejection_is_a_generation_error_and_5xx_or_garbage_an_engine_failure(engine) -> None:
    async def rejected(_r: web.Request) -> web.Response:
        return web.json_response({"error": "prompt too long"}, status=400)

    gen, _ = await engine(rejected)
    url = (await gen.pool.refresh())[0]
    with pytest.raises(GenerationError, match="rejected the request"):
        await gen._post(url, KEY, "hi", 0, gen.sampling)

    async def broken(_r: web.Request) -> web.Response:
        return web.Response(status=503, text="overloaded")

    gen, _ = await engine(broken)
    url = (await gen.pool.refresh())[0]
    with pytest.raises(EngineFailure, match="HTTP 503"):
        await gen._post(url, KEY, "hi", 0, gen.sampling)

    async def not_json(_r: web.Request) -> web.Response:
        return web.Response(status=200, text="<html>")

    gen, _ = await engine(not_json)
    url = (await gen.pool.refresh())[0]
    with pytest.raises(EngineFailure):
        await gen._post(url, KEY, "hi", 0, gen.sampling)
