"""A light stand-in for one vLLM 0.32 server: the HTTP routes the controller and the executor
drive, no model. The one stand-in engine of every test tier (integration and e2e).

Why it exists: the test cluster's simulated GPU nodes have no GPUs and the machine has 2
cores; a real vLLM CPU server costs ~3 GiB and half a minute to start, so one real cell per
test proves the real path and every other cell is this process. It keeps the state its
routes change (paused, sleeping, weight version, reloads, requests served) so a probe, a
weight-update window or an offload sees an engine that behaves like one, and it answers
completions with what RL needs (token ids, prompt token ids, one logprob per token), so the
RolloutExecutor can generate against it.

What a test can do to it:
- kill the process: the cell dies (the agent fails its pod);
- `POST /standin/unhealthy`: `/health` answers 503 from then on while the process lives;
- `POST /standin/slow?seconds=S`: `/health` answers 200, but only after S seconds (a slow
  engine: past the probe timeout it counts as a failed probe);
- `POST /standin/garbage?kind=html`: every engine route answers a proxy's `502 Bad Gateway`
  HTML page from then on; `kind=bytes`: the port answers bytes that are not HTTP at all (some
  other program on the port); the `/standin/` routes keep working;
- `POST /standin/refuse?route=R`: the engine route `/R` (e.g. `sleep`, `wake_up`) answers
  `500` with an error from then on (an engine whose offload or onload fails);
- `SIGSTOP` the process: the socket stays open and nothing answers (a hung engine);
- SGLang's `GET /health_generate` is answered like `/health`, so multi-node SGLang cells
  (every pod runs `python -m sglang.launch_server`) can be stand-ins too;
- `--standin-delay SECONDS` (or RLJOB_STANDIN_DELAY): each completion answers after a delay,
  so requests are in flight when the test kills the engine or opens a weight update;
- RLJOB_STANDIN_GATE=DIR: do not listen before DIR/open or DIR/cell-<index> exists, so a test
  holds cells in Starting for as long as it needs (a file it creates, no timing).
It prints `serving on HOST:PORT` once it listens and `request N` per completion (a test
counts them in its log).

How it starts: engine pods keep the command the operator's manifest builder gives them
(`python -m vllm.entrypoints.openai.api_server ...`); the test puts this directory on the
pod's PYTHONPATH and `sitecustomize.py` here picks the cells that run this module instead
(see there). It also runs on its own, with vLLM's flags (`--host`, `--port`, the rest ignored):

    python tests/engine_standin/rljob_engine_standin.py --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

PROMPT_TOKEN_IDS = [5, 6, 7]  # what every completion reports as the prompt's ids


@dataclass
class EngineState:
    """What the engine routes change and report."""

    model: str
    delay_seconds: float = 0.0
    healthy: bool = True
    health_delay: float = 0.0
    garbage: str = ""  # "", "html" or "bytes": what every engine route answers instead
    refused: set[str] = field(default_factory=set)  # engine routes answering 500
    paused: bool = False
    sleeping: bool = False
    weight_version: str | None = None
    reloads: list[str] = field(default_factory=list)
    requests_served: int = 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """vLLM's flags that matter here, plus the stand-in's own; anything else is ignored."""
    p = argparse.ArgumentParser(prog="engine-standin", add_help=True)
    p.add_argument("--host", default=os.environ.get("POD_IP", "127.0.0.1"))
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="standin")
    p.add_argument("--standin-delay", type=float, default=float(os.environ.get("RLJOB_STANDIN_DELAY", "0") or 0))
    args, _unknown = p.parse_known_args(list(argv))
    return args


def completion_reply(state: EngineState, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI completions reply with vLLM's `return_token_ids` fields and sampled logprobs."""
    n = int(body.get("n", 1) or 1)
    max_tokens = int(body.get("max_tokens", 16) or 16)
    choices = []
    for i in range(n):
        ids = [random.randrange(3, 1000) for _ in range(max_tokens)]
        choices.append({
            "index": i, "text": " ".join(map(str, ids)), "finish_reason": "length",
            "token_ids": ids, "prompt_token_ids": list(PROMPT_TOKEN_IDS),
            "logprobs": {"token_logprobs": [-1.0] * max_tokens},
        })  # fmt: skip
    return {
        "id": f"cmpl-{state.requests_served}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model", state.model),
        "choices": choices,
        "usage": {"prompt_tokens": len(PROMPT_TOKEN_IDS), "completion_tokens": n * max_tokens,
                  "total_tokens": len(PROMPT_TOKEN_IDS) + n * max_tokens},
    }  # fmt: skip


BAD_GATEWAY_HTML = "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center></body></html>"
NOT_HTTP = b"SSH-2.0-OpenSSH_9.6\r\n"


def make_app(state: EngineState) -> web.Application:
    @web.middleware
    async def garbage_answers(r: web.Request, handler: Any) -> web.StreamResponse:
        if r.path.startswith("/standin/"):
            return await handler(r)
        if r.path in state.refused:
            return web.json_response({"error": f"stand-in refuses {r.path}"}, status=500)
        if not state.garbage:
            return await handler(r)
        if state.garbage == "html":
            return web.Response(status=502, text=BAD_GATEWAY_HTML, content_type="text/html")
        assert r.transport is not None
        r.transport.write(NOT_HTTP)
        r.transport.close()
        return web.Response()  # never sent: the connection is closed

    async def refuse(r: web.Request) -> web.Response:
        state.refused.add("/" + r.query["route"].lstrip("/"))
        return web.json_response({"refused": sorted(state.refused)})

    async def garbage(r: web.Request) -> web.Response:
        state.garbage = r.query.get("kind", "html")
        return web.json_response({"garbage": state.garbage})

    async def health(_r: web.Request) -> web.Response:
        if state.health_delay:
            await asyncio.sleep(state.health_delay)
        return web.Response(status=200 if state.healthy else 503, text="")

    async def unhealthy(_r: web.Request) -> web.Response:
        state.healthy = False
        return web.json_response({"healthy": False})

    async def slow(r: web.Request) -> web.Response:
        state.health_delay = float(r.query.get("seconds", "5"))
        return web.json_response({"healthDelaySeconds": state.health_delay})

    async def models(_r: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": state.model, "object": "model"}]})

    async def completions(r: web.Request) -> web.Response:
        body = await r.json()
        if state.paused or state.sleeping:
            return web.json_response({"error": "engine is paused or sleeping"}, status=503)
        state.requests_served += 1
        print("request", state.requests_served, flush=True)
        if state.delay_seconds > 0:
            await asyncio.sleep(state.delay_seconds)  # the test's in-flight window, not a wait for state
        return web.json_response(completion_reply(state, body))

    async def metrics(_r: web.Request) -> web.Response:
        text = (
            "vllm:num_requests_running 0\n"
            "vllm:num_requests_waiting 0\n"
            "vllm:kv_cache_usage_perc 0\n"
            f"vllm:engine_sleep_state {1 if state.sleeping else 0}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def ok(_r: web.Request) -> web.Response:
        return web.json_response({})

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
        state.weight_version = (await r.json()).get("new_version")
        return web.json_response({"success": True})

    async def weight_checker(_r: web.Request) -> web.Response:
        return web.json_response({"checksums": {"rank0": f"standin-{len(state.reloads)}"}})

    app = web.Application(middlewares=[garbage_answers])
    app.add_routes([
        web.get("/health", health),
        web.get("/health_generate", health),
        web.post("/standin/unhealthy", unhealthy),
        web.post("/standin/slow", slow),
        web.post("/standin/garbage", garbage),
        web.post("/standin/refuse", refuse),
        web.get("/v1/models", models),
        web.post("/v1/completions", completions),
        web.get("/metrics", metrics),
        web.post("/pause", pause),
        web.post("/resume", resume),
        web.get("/is_paused", is_paused),
        web.post("/sleep", sleep),
        web.post("/wake_up", wake_up),
        web.get("/is_sleeping", is_sleeping),
        web.post("/release_kv_cache_memory", ok),
        web.post("/reset_prefix_cache", reset_prefix_cache),
        web.post("/abort_requests", abort_requests),
        web.post("/collective_rpc", collective_rpc),
        web.get("/weight_info", weight_info),
        web.post("/update_weight_version", update_weight_version),
        web.post("/weight_checker", weight_checker),
    ])  # fmt: skip
    return app


def wait_for_gate(cell: str) -> None:
    """With RLJOB_STANDIN_GATE=DIR, do not listen before DIR/open or DIR/cell-<index> exists.

    Polls a file the test creates: the test, not a timer, decides when the cell may start.
    """
    gate = os.environ.get("RLJOB_STANDIN_GATE")
    if not gate:
        return
    while not (os.path.exists(os.path.join(gate, "open")) or os.path.exists(os.path.join(gate, f"cell-{cell}"))):
        time.sleep(0.1)


def serve(argv: Sequence[str], cell: str = "") -> None:
    """Listen with vLLM's command line `argv` until killed; `cell` is the cell index (gate)."""
    args = parse_args(argv)
    wait_for_gate(cell)
    state = EngineState(model=args.model, delay_seconds=args.standin_delay)
    web.run_app(make_app(state), host=args.host, port=args.port, access_log=None, handle_signals=True,
                print=lambda *_: print(f"serving on {args.host}:{args.port} pid {os.getpid()}", flush=True))  # fmt: skip


if __name__ == "__main__":
    serve(sys.argv[1:])
    os._exit(0)
