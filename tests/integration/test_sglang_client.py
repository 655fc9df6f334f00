"""SGLangClient against a stand-in SGLang HTTP server.

SGLang cannot run on this machine (no GPU build, no CPU wheel for it here), so this test
serves SGLang's control routes from a small aiohttp app written below, with the request
fields, status codes and reply bodies of sglang/srt/entrypoints/http_server.py and
managers/io_struct.py (read from the public repository): it pins down the client's logic
(routes, bodies, reply parsing, error mapping), not SGLang's behaviour. The real-engine
integration test of the same EngineClient port is tests/integration/test_vllm_client.py.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from controller_runtime.api.spec import MemoryTag, PauseMode
from controller_runtime.clients import SGLangClient, make_engine_client
from controller_runtime.errors import EngineError, EngineHTTPError, EngineProtocolError

ALL_TAGS = ("weights", "kv_cache", "cuda_graph")


@dataclass
class FakeSGLangState:
    """What the stand-in remembers, so that tests can see the effect of each call."""

    model_path: str = "/models/base"
    weight_version: str = "default"
    paused_mode: str | None = None
    released: set[str] = field(default_factory=set)
    running_requests: int = 0
    aborted_all: int = 0
    aborted_rids: list[str] = field(default_factory=list)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    distributed_updates: list[dict[str, Any]] = field(default_factory=list)
    healthy: bool = True
    tp_size: int = 2
    calls: list[str] = field(default_factory=list)

    def checksums(self, rank: int) -> dict[str, str]:
        return {
            name: hashlib.sha256(f"{self.model_path}:{rank}:{name}".encode()).hexdigest()
            for name in ("model.embed_tokens.weight", "lm_head.weight")
        }


def _validation_error(message: str) -> web.Response:
    # SGLang turns FastAPI's 422 into 400 with an ErrorResponse body.
    return web.json_response(
        {"object": "error", "message": message, "type": "Bad Request", "code": 400}, status=400
    )


async def _fields(request: web.Request, required: tuple[str, ...] = ()) -> dict[str, Any] | web.Response:
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        return _validation_error("body is not JSON")
    if not isinstance(body, dict):
        return _validation_error("body must be an object")
    missing = [k for k in required if k not in body]
    return _validation_error(f"missing fields {missing}") if missing else body


def sglang_app(state: FakeSGLangState) -> web.Application:
    app = web.Application()

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        state.calls.append(f"{request.method} {request.path}")
        return await handler(request)

    app.middlewares.append(record)

    async def health_generate(_: web.Request) -> web.Response:
        return web.Response(status=200 if state.healthy else 503)

    async def flush_cache(_: web.Request) -> web.Response:
        ok = state.running_requests == 0
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details.\n", status=200 if ok else 400
        )

    async def release(request: web.Request) -> web.Response:
        body = await _fields(request)
        if isinstance(body, web.Response):
            return body
        state.released |= set(body.get("tags") or ALL_TAGS)
        return web.json_response(None)

    async def resume(request: web.Request) -> web.Response:
        body = await _fields(request)
        if isinstance(body, web.Response):
            return body
        state.released -= set(body.get("tags") or ALL_TAGS)
        return web.json_response(None)

    async def update_from_disk(request: web.Request) -> web.Response:
        body = await _fields(request, ("model_path",))
        if isinstance(body, web.Response):
            return body
        if not os.path.isdir(body["model_path"]):  # noqa: ASYNC240 - a local stat in a test server
            content = {
                "success": False,
                "message": f"Failed to load {body['model_path']}",
                "num_paused_requests": 0,
            }
            return web.json_response(content, status=400)
        state.model_path = body["model_path"]
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            state.weight_version = body["weight_version"]
            message += f" Weight version updated to {body['weight_version']}."
        return web.json_response({"success": True, "message": message, "num_paused_requests": 0})

    async def init_group(request: web.Request) -> web.Response:
        body = await _fields(request, ("master_address", "master_port", "rank_offset", "world_size"))
        if isinstance(body, web.Response):
            return body
        state.groups[body.get("group_name", "weight_update_group")] = body
        return web.json_response(
            {"success": True, "message": "Succeeded to initialize custom process group."}
        )

    async def update_distributed(request: web.Request) -> web.Response:
        body = await _fields(request, ("names", "dtypes", "shapes"))
        if isinstance(body, web.Response):
            return body
        if body.get("group_name", "weight_update_group") not in state.groups:
            return web.json_response({"success": False, "message": "Group not initialized"}, status=400)
        state.distributed_updates.append(body)
        if body.get("weight_version") is not None:
            state.weight_version = body["weight_version"]
        return web.json_response({"success": True, "message": "Succeeded to update parameter online."})

    async def pause_generation(request: web.Request) -> web.Response:
        body = await _fields(request)
        if isinstance(body, web.Response):
            return body
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return _validation_error(f"Invalid mode: {mode!r}")
        state.paused_mode = mode
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(_: web.Request) -> web.Response:
        state.paused_mode = None
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(request: web.Request) -> web.Response:
        body = await _fields(request)
        if isinstance(body, web.Response):
            return body
        if body.get("abort_all"):
            state.aborted_all += 1
        else:
            state.aborted_rids.append(body.get("rid", ""))
        return web.Response(status=200)

    async def get_weight_version(_: web.Request) -> web.Response:
        return web.json_response({"weight_version": state.weight_version})

    async def update_weight_version(request: web.Request) -> web.Response:
        body = await _fields(request, ("new_version",))
        if isinstance(body, web.Response):
            return body
        state.weight_version = body["new_version"]
        return web.json_response(
            {
                "success": True,
                "message": f"Weight version updated to {body['new_version']}",
                "new_version": body["new_version"],
            }
        )

    async def weights_checker(request: web.Request) -> web.Response:
        body = await _fields(request)
        if isinstance(body, web.Response):
            return body
        if body.get("action", "checksum") != "checksum":
            return web.json_response({"success": False, "message": "Unsupported action"}, status=400)
        ranks = [
            {"checksums": state.checksums(r), "parallelism_info": {"rank": r}}
            for r in reversed(range(state.tp_size))
        ]
        return web.json_response({"success": True, "message": "ok", "ranks": ranks})

    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/health", health_generate)
    app.router.add_route("*", "/flush_cache", flush_cache)
    app.router.add_route("*", "/release_memory_occupation", release)
    app.router.add_route("*", "/resume_memory_occupation", resume)
    app.router.add_post("/update_weights_from_disk", update_from_disk)
    app.router.add_post("/init_weights_update_group", init_group)
    app.router.add_post("/update_weights_from_distributed", update_distributed)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_get("/get_weight_version", get_weight_version)
    app.router.add_post("/update_weight_version", update_weight_version)
    app.router.add_post("/weights_checker", weights_checker)
    return app


@pytest_asyncio.fixture(loop_scope="function")  # same loop as the test that uses it
async def sglang() -> AsyncIterator[tuple[SGLangClient, FakeSGLangState]]:
    state = FakeSGLangState()
    runner = web.AppRunner(sglang_app(state))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = SGLangClient(f"http://127.0.0.1:{port}", timeout=10.0)
    try:
        yield client, state
    finally:
        await client.close()
        await runner.cleanup()


async def test_health_is_health_generate_and_503_is_an_http_error(
    sglang: tuple[SGLangClient, FakeSGLangState],
) -> None:
    client, state = sglang
    await client.health()
    assert state.calls == ["GET /health_generate"]
    state.healthy = False
    with pytest.raises(EngineHTTPError) as err:
        await client.health()
    assert err.value.status == 503


@pytest.mark.parametrize(
    ("mode", "sglang_mode"),
    [(PauseMode.abort, "abort"), (PauseMode.wait, "retract"), (PauseMode.keep, "in_place")],
)
async def test_pause_modes_map_to_sglang_modes(
    sglang: tuple[SGLangClient, FakeSGLangState], mode: PauseMode, sglang_mode: str
) -> None:
    client, state = sglang
    await client.pause(mode)
    assert state.paused_mode == sglang_mode
    await client.resume()
    assert state.paused_mode is None


async def test_an_unknown_pause_mode_is_rejected_by_the_engine(
    sglang: tuple[SGLangClient, FakeSGLangState],
) -> None:
    client, state = sglang
    with pytest.raises(EngineHTTPError) as err:
        await client.pause_generation("wait")
    assert err.value.status == 400 and state.paused_mode is None


async def test_release_and_resume_memory_send_the_tags(sglang: tuple[SGLangClient, FakeSGLangState]) -> None:
    client, state = sglang
    await client.release_memory([MemoryTag.kv_cache, MemoryTag.cuda_graph, MemoryTag.weights])
    assert state.released == set(ALL_TAGS)
    await client.resume_memory([MemoryTag.weights])
    assert state.released == {"kv_cache", "cuda_graph"}
    await client.resume_memory_occupation(None)  # no tags: everything
    assert state.released == set()


async def test_flush_cache_fails_while_requests_run(sglang: tuple[SGLangClient, FakeSGLangState]) -> None:
    client, state = sglang
    state.running_requests = 1
    with pytest.raises(EngineHTTPError) as err:
        await client.flush_cache()
    assert err.value.status == 400
    state.running_requests = 0
    await client.flush_cache()


async def test_update_weights_from_disk_sets_path_and_version(
    sglang: tuple[SGLangClient, FakeSGLangState], tmp_path: Path
) -> None:
    client, state = sglang
    await client.update_weights_from_disk(str(tmp_path), "step-3")
    assert (state.model_path, state.weight_version) == (str(tmp_path), "step-3")
    assert await client.get_weight_version() == "step-3"


async def test_a_failed_disk_update_is_an_error_and_changes_nothing(
    sglang: tuple[SGLangClient, FakeSGLangState],
) -> None:
    client, state = sglang
    with pytest.raises(EngineHTTPError) as err:
        await client.update_weights_from_disk("/nonexistent/ckpt", "step-9")
    assert err.value.status == 400 and '"success": false' in err.value.body.replace("False", "false")
    assert (state.model_path, state.weight_version) == ("/models/base", "default")


async def test_distributed_update_needs_the_group_first(sglang: tuple[SGLangClient, FakeSGLangState]) -> None:
    client, state = sglang
    with pytest.raises(EngineHTTPError):
        await client.update_weights_from_distributed(["w"], ["bfloat16"], [[2, 2]])
    await client.init_weights_update_group("127.0.0.1", 29500, rank_offset=1, world_size=3)
    assert state.groups["weight_update_group"]["backend"] == "nccl"
    await client.update_weights_from_distributed(["w"], ["bfloat16"], [[2, 2]], weight_version="step-4")
    sent = state.distributed_updates[-1]
    assert (sent["names"], sent["shapes"], sent["flush_cache"]) == (["w"], [[2, 2]], True)
    assert await client.get_weight_version() == "step-4"


async def test_weight_version_round_trips(sglang: tuple[SGLangClient, FakeSGLangState]) -> None:
    client, _ = sglang
    assert await client.get_weight_version() == "default"
    await client.set_weight_version("rl-7")
    assert await client.get_weight_version() == "rl-7"


async def test_abort_all_and_abort_one(sglang: tuple[SGLangClient, FakeSGLangState]) -> None:
    client, state = sglang
    await client.abort_all()
    await client.abort_request("req-1")
    assert state.aborted_all == 1 and state.aborted_rids == ["req-1"]


async def test_checksums_are_merged_per_rank_and_follow_the_weights(
    sglang: tuple[SGLangClient, FakeSGLangState], tmp_path: Path
) -> None:
    client, _ = sglang
    before = await client.weight_checksums()
    assert set(before) == {
        f"rank{r}/{n}" for r in (0, 1) for n in ("model.embed_tokens.weight", "lm_head.weight")
    }
    await client.update_weights_from_disk(str(tmp_path))
    after = await client.weight_checksums()
    assert after.keys() == before.keys() and after != before


async def test_an_unsuccessful_checker_action_is_an_error(
    sglang: tuple[SGLangClient, FakeSGLangState],
) -> None:
    client, _ = sglang
    with pytest.raises(EngineError):
        await client.weights_checker("snapshot")


async def test_a_reply_without_checksums_is_a_protocol_error() -> None:
    async def checker(_: web.Request) -> web.Response:
        return web.json_response({"success": True, "message": "ok"})

    app = web.Application()
    app.router.add_post("/weights_checker", checker)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = make_engine_client("sglang", f"http://127.0.0.1:{port}", timeout=10.0)
    try:
        with pytest.raises(EngineProtocolError):
            await client.weight_checksums()
    finally:
        await client.close()
        await runner.cleanup()
