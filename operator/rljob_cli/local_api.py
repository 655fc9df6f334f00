"""The controller API served by `rljob run` for its executor process, on 127.0.0.1 only.

On Kubernetes the executor discovers serving engines by polling the operator's controller
API (`cells.servingEndpoints`); local mode serves the same paths over its in-process
controller so the executor runs unchanged. A random bearer token (written to a 0600 file the
executor reads) keeps other local users out. The trainer does not come through here: it
shares the runner's event loop and calls the controller directly (LocalControllerClient).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from aiohttp import web

from controller_runtime.api.control import API_PREFIX
from controller_runtime.api.verbs import decode_body, dispatch, verb_for
from controller_runtime.api.wire_errors import (
    ControllerJobNotFound,
    ControllerUnauthenticated,
    answer_for,
    refusal,
)
from rljob_cli.vllm_process import free_port

ROUTE = API_PREFIX + "/namespaces/{namespace}/rljobs/{name}/{verb}"


def error_response(exc: BaseException) -> web.Response:
    """The error table's answer, exactly as the operator's server gives it."""
    answer = answer_for(exc)
    return web.json_response(answer.body.to_wire(), status=answer.status, headers=answer.headers or None)


class LocalControlAPI:
    def __init__(self, controller: Any, job: str, namespace: str, token_file: Path) -> None:
        self.controller = controller
        self.job = job
        self.namespace = namespace
        self.token = secrets.token_urlsafe(24)
        self.token_file = token_file
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        self.token_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        app = web.Application()
        app.router.add_route("*", ROUTE, self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def handle(self, request: web.Request) -> web.Response:
        try:
            return await self._serve(request)
        except Exception as exc:  # every failure is the table's answer, as on the cluster
            return error_response(exc)

    async def _serve(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            raise refusal(ControllerUnauthenticated, "missing or wrong bearer token")
        info = request.match_info
        if (info["namespace"], info["name"]) != (self.namespace, self.job):
            raise refusal(ControllerJobNotFound, f"RLJob {info['namespace']}/{info['name']} is not run here")
        verb = verb_for(info["verb"], request.method)
        body = decode_body(await request.text()) if request.method != "GET" and request.can_read_body else {}
        out = await dispatch(verb, self.controller, body)
        return web.json_response(out.to_wire())
