"""A light stand-in for a vLLM server: the HTTP routes the controller drives, no model.

Used by the operator's cluster tests for the cells that need not be real engines (a real
vLLM CPU server costs 3 GiB and half a minute; one real cell per test is enough to prove the
path). It keeps the state those routes change (paused, sleeping, weight version), and
answers `/health` with 503 after `POST /standin/unhealthy` so a test can make a cell fail its
probes while its process stays alive.
"""

from __future__ import annotations

import os
import sys
import time

from aiohttp import web


def make_app() -> web.Application:
    state = {"healthy": True, "paused": False, "sleeping": False, "version": None}

    async def health(_r: web.Request) -> web.Response:
        return web.Response(status=200 if state["healthy"] else 503, text="")

    async def unhealthy(_r: web.Request) -> web.Response:
        state["healthy"] = False
        return web.json_response({"healthy": False})

    async def ok(_r: web.Request) -> web.Response:
        return web.json_response({})

    async def pause(_r: web.Request) -> web.Response:
        state["paused"] = True
        return web.json_response({})

    async def resume(_r: web.Request) -> web.Response:
        state["paused"] = False
        return web.json_response({})

    async def sleep(_r: web.Request) -> web.Response:
        state["sleeping"] = True
        return web.json_response({})

    async def wake_up(_r: web.Request) -> web.Response:
        state["sleeping"] = False
        return web.json_response({"status": "awake"})

    async def is_sleeping(_r: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": state["sleeping"]})

    async def reset_prefix_cache(_r: web.Request) -> web.Response:
        return web.json_response({"success": True})

    async def abort_requests(_r: web.Request) -> web.Response:
        return web.json_response({"aborted": 0})

    async def collective_rpc(_r: web.Request) -> web.Response:
        return web.json_response({"results": [None]})

    async def weight_info(_r: web.Request) -> web.Response:
        return web.json_response({"weight_version": state["version"]})

    async def update_weight_version(r: web.Request) -> web.Response:
        state["version"] = (await r.json()).get("new_version")
        return web.json_response({"success": True})

    async def completions(_r: web.Request) -> web.Response:
        return web.json_response({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]})

    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/standin/unhealthy", unhealthy)
    app.router.add_post("/pause", pause)
    app.router.add_post("/resume", resume)
    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    app.router.add_get("/is_sleeping", is_sleeping)
    app.router.add_post("/release_kv_cache_memory", ok)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_post("/abort_requests", abort_requests)
    app.router.add_post("/collective_rpc", collective_rpc)
    app.router.add_get("/weight_info", weight_info)
    app.router.add_post("/update_weight_version", update_weight_version)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    return app


def wait_for_gate(cell: str) -> None:
    """With RLJOB_STANDIN_GATE=DIR, do not listen before DIR/open or DIR/cell-<index> exists:
    a test holds cells in Starting for as long as it needs (polling a file, no timing)."""
    gate = os.environ.get("RLJOB_STANDIN_GATE")
    if not gate:
        return
    while not (os.path.exists(os.path.join(gate, "open")) or os.path.exists(os.path.join(gate, f"cell-{cell}"))):
        time.sleep(0.1)


def serve(argv: list[str], cell: str = "") -> None:
    def arg(flag: str, default: str) -> str:
        return argv[argv.index(flag) + 1] if flag in argv else default

    wait_for_gate(cell)
    web.run_app(make_app(), host=arg("--host", "127.0.0.1"), port=int(arg("--port", "8000")), print=None)


if __name__ == "__main__":
    serve(sys.argv[1:])
    os._exit(0)
