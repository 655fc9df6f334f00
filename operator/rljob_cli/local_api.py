"""The controller API served by `rljob run` for its executor process, on 127.0.0.1 only.

On Kubernetes the executor discovers serving engines by polling the operator's controller
API (`cells.servingEndpoints`); local mode serves the same paths over its in-process
controller so the executor runs unchanged. A random bearer token (written to a 0600 file the
executor reads) keeps other local users out. The trainer does not come through here: it
shares the runner's event loop and calls the controller directly (LocalControllerClient).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError
from rljob_client.controller_client import cells_response, window_response

from controller_runtime.api.control import (
    API_PREFIX,
    AbortUpdateRequest,
    AbortUpdateResponse,
    EndUpdateRequest,
    ErrorResponse,
    EvalFleetResponse,
    PrepareRolloutRequest,
    StartUpdateRequest,
    TagsRequest,
)
from controller_runtime.errors import ControllerError, LockHeld, SnapshotMismatch
from rljob_cli.vllm_process import free_port

ROUTE = API_PREFIX + "/namespaces/{namespace}/rljobs/{name}/{verb}"


def error(status: int, reason: str, message: str) -> web.Response:
    body = ErrorResponse(error=message, reason=reason).to_wire()
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


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
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return error(401, "Unauthorized", "missing or wrong bearer token")
        info = request.match_info
        if (info["namespace"], info["name"]) != (self.namespace, self.job):
            return error(404, "JobNotFound", f"RLJob {info['namespace']}/{info['name']} is not run here")
        try:
            body = await request.json() if request.can_read_body else {}
            out = await self.serve(info["verb"], body)
        except ValidationError as exc:
            return error(400, "BadRequest", str(exc))
        except (LockHeld, SnapshotMismatch) as exc:
            return error(409, type(exc).__name__, str(exc))
        except ControllerError as exc:
            return error(409, type(exc).__name__, str(exc))
        except KeyError as exc:
            return error(404, "UnknownVerb", str(exc))
        return web.json_response(out.to_wire())

    async def serve(self, verb: str, body: dict[str, Any]) -> BaseModel:
        c = self.controller
        if verb == "cells":
            return cells_response(c)
        if verb == "eval_fleet":
            return EvalFleetResponse(ok=False, skip_reason="not_configured")
        if verb == "prepare_rollout":
            await c.prepare_rollout(PrepareRolloutRequest.model_validate(body).rollout_id)
        elif verb == "offload":
            await c.offload(TagsRequest.model_validate(body).tags)
        elif verb == "onload":
            await c.onload(TagsRequest.model_validate(body).tags)
        elif verb == "start_update_weights":
            return window_response(await c.start_update_weights(StartUpdateRequest.model_validate(body).holder))
        elif verb == "end_update_weights":
            req = EndUpdateRequest.model_validate(body)
            await c.end_update_weights(req.snapshot, req.weight_version)
        elif verb == "abort_update_weights":
            stopped = await c.abort_update_weights(AbortUpdateRequest.model_validate(body).snapshot)
            return AbortUpdateResponse(stopped=list(stopped))
        else:
            raise KeyError(f"unknown verb {verb!r}")
        return cells_response(c)
