"""A light HTTP stand-in for one vLLM engine, for the end-to-end tests on the test cluster.

The test cluster's simulated GPU nodes have no GPUs and the machine has 2 cores: four real
vLLM servers would not fit, and the e2e tests are about the operator's behaviour seen
through `kubectl`, not about generation. This process answers the routes the controller
and the executor drive on vLLM 0.32 (`/health`, `/v1/completions`, `/pause`, `/resume`,
`/sleep`, `/wake_up`, `/collective_rpc`, `/weight_info`, `/update_weight_version`, ...) and
keeps the state those routes change, so a probe, a window or an offload sees an engine that
behaves like one. Killing the process is how a test makes a cell die.

It accepts vLLM's own command line (`--host`, `--port`, and ignores the rest), so the
engine pod keeps the command the operator's manifest builder gives it: the test puts
`tests/e2e/engine_shim` on the pod's PYTHONPATH, where `vllm.entrypoints.openai.api_server`
is a two-line module that calls `main()` here. It can also be run on its own:

    python -m tests.e2e.engine_standin --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class EngineState:
    """What the engine routes change and report."""

    model: str
    paused: bool = False
    sleeping: bool = False
    weight_version: str | None = None
    reloads: list[str] = field(default_factory=list)
    requests_served: int = 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """vLLM's flags that matter here; anything else on the command line is ignored."""
    p = argparse.ArgumentParser(prog="engine-standin", add_help=True)
    p.add_argument("--host", default=os.environ.get("POD_IP", "127.0.0.1"))
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="standin")
    args, _unknown = p.parse_known_args(list(argv))
    return args


def make_app(state: EngineState) -> web.Application:
    async def health(_r: web.Request) -> web.Response:
        return web.Response(status=200)

    async def completions(r: web.Request) -> web.Response:
        body = await r.json()
        if state.paused or state.sleeping:
            return web.json_response({"error": "engine is paused or sleeping"}, status=503)
        state.requests_served += 1
        n = int(body.get("n", 1))
        max_tokens = int(body.get("max_tokens", 16))
        choice_text = " ok" * max(1, min(max_tokens, 8))
        return web.json_response({
            "id": f"cmpl-{state.requests_served}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model", state.model),
            "choices": [{"index": i, "text": choice_text, "finish_reason": "length", "logprobs": None}
                        for i in range(n)],
            "usage": {"prompt_tokens": 1, "completion_tokens": n * max_tokens,
                      "total_tokens": 1 + n * max_tokens},
        })

    async def metrics(_r: web.Request) -> web.Response:
        text = (
            "vllm:num_requests_running 0\n"
            "vllm:num_requests_waiting 0\n"
            "vllm:kv_cache_usage_perc 0\n"
            f"vllm:engine_sleep_state {1 if state.sleeping else 0}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def pause(_r: web.Request) -> web.Response:
        state.paused = True
        return web.json_response({})

    async def resume(_r: web.Request) -> web.Response:
        state.paused = False
        return web.json_response({})

    async def is_paused(_r: web.Request) -> web.Response:
        return web.json_response({"is_paused": state.paused})

    async def sleep(_r: web.Request) -> web.Response:
        state.sleeping = True
        return web.json_response({})

    async def wake_up(_r: web.Request) -> web.Response:
        state.sleeping = False
        return web.json_response({"status": "awake"})

    async def is_sleeping(_r: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": state.sleeping})

    async def reset_prefix_cache(_r: web.Request) -> web.Response:
        return web.json_response({"success": True})

    async def abort_requests(_r: web.Request) -> web.Response:
        return web.json_response({"aborted": 0})

    async def collective_rpc(r: web.Request) -> web.Response:
        body: dict[str, Any] = await r.json()
        if body.get("method") == "reload_weights":
            path = (body.get("kwargs") or {}).get("weights_path") or next(iter(body.get("args") or []), "")
            state.reloads.append(str(path))
        return web.json_response({"results": [None]})

    async def weight_info(_r: web.Request) -> web.Response:
        return web.json_response({"weight_version": state.weight_version})

    async def update_weight_version(r: web.Request) -> web.Response:
        body = await r.json()
        state.weight_version = body.get("new_version")
        return web.json_response({"success": True})

    async def weight_checker(_r: web.Request) -> web.Response:
        return web.json_response({"checksums": {"rank0": f"standin-{len(state.reloads)}"}})

    app = web.Application()
    app.add_routes([
        web.get("/health", health),
        web.post("/v1/completions", completions),
        web.get("/metrics", metrics),
        web.post("/pause", pause),
        web.post("/resume", resume),
        web.get("/is_paused", is_paused),
        web.post("/sleep", sleep),
        web.post("/wake_up", wake_up),
        web.get("/is_sleeping", is_sleeping),
        web.post("/reset_prefix_cache", reset_prefix_cache),
        web.post("/abort_requests", abort_requests),
        web.post("/collective_rpc", collective_rpc),
        web.get("/weight_info", weight_info),
        web.post("/update_weight_version", update_weight_version),
        web.post("/weight_checker", weight_checker),
    ])  # fmt: skip
    return app


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(json.dumps({"standin": "vllm", "host": args.host, "port": args.port, "pid": os.getpid()}), flush=True)
    web.run_app(make_app(EngineState(model=args.model)), host=args.host, port=args.port,
                print=None, access_log=None, handle_signals=True)


if __name__ == "__main__":
    main()
