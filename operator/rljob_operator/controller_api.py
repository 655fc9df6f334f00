"""The controller API: the trainer side drives a job's InferenceController over HTTP.

Paths and bodies are `controller_runtime.api.control` (shared with the client). Every call
is checked in this order: this replica leads (else 503 + Retry-After, so a client retries
against the Service until it reaches the leader), the caller is authenticated and
authorized (401 / 403), the job has a running controller here (404, or 503 while its daemon
is still starting). Then the controller method runs and its effect is written into the
RLJob `status` *before* the answer goes out, so a failover never loses an acknowledged step.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from controller_runtime.api.control import (
    API_PREFIX,
    AbortUpdateRequest,
    AbortUpdateResponse,
    CellsResponse,
    EndUpdateRequest,
    EngineEndpoint,
    ErrorResponse,
    EvalFleetResponse,
    PrepareRolloutRequest,
    StartUpdateRequest,
    TagsRequest,
    UpdateWindowResponse,
)
from controller_runtime.clock import parse_iso
from controller_runtime.errors import (
    ControllerError,
    EngineError,
    EngineTimeout,
    LockHeld,
    SnapshotMismatch,
    WeightCheckMismatch,
)
from rljob_operator.auth import Authorizer
from rljob_operator.metrics import Metrics
from rljob_operator.registry import JobHandle, JobRegistry

log = logging.getLogger(__name__)

JOB_ROUTE = API_PREFIX + "/namespaces/{namespace}/rljobs/{name}/{verb}"
RETRY_AFTER_S = 2


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    def response(self) -> web.Response:
        body = ErrorResponse(error=self.message, reason=self.reason, retry_after_seconds=self.retry_after)
        headers = {"Retry-After": str(max(1, round(self.retry_after)))} if self.retry_after is not None else None
        return web.json_response(body.to_wire(), status=self.status, headers=headers)


def error_for(exc: BaseException) -> ApiError:
    """Map controller failures to HTTP answers a client can act on."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValidationError):
        return ApiError(400, "BadRequest", str(exc))
    if isinstance(exc, LockHeld):
        return ApiError(409, "LockHeld", str(exc), retry_after=RETRY_AFTER_S)
    if isinstance(exc, SnapshotMismatch):
        return ApiError(409, "SnapshotMismatch", str(exc))
    if isinstance(exc, WeightCheckMismatch):
        return ApiError(409, "WeightCheckFailed", str(exc))
    if isinstance(exc, EngineTimeout | TimeoutError):
        return ApiError(504, "EngineTimeout", str(exc))
    if isinstance(exc, EngineError):
        return ApiError(502, "EngineError", str(exc))
    if isinstance(exc, ControllerError):
        return ApiError(409, type(exc).__name__, str(exc))
    return ApiError(500, "InternalError", f"{type(exc).__name__}: {exc}")


def cells_response(controller: Any) -> CellsResponse:
    patch = controller.status_patch()
    return CellsResponse(
        engines=controller.engine_statuses(),
        weight_version=patch.get("weightVersion"),
        rollout_id=patch.get("rolloutId"),
        serving_endpoints=list(controller.serving_endpoints()),
        lock=patch.get("lock"),
    )


def window_response(window: Any) -> UpdateWindowResponse:
    return UpdateWindowResponse(
        engines=[
            EngineEndpoint(
                cell=e.name, endpoint=e.endpoint, gpu_count=e.gpu_count, gpu_offset=e.gpu_offset, generation=e.generation
            )
            for e in window.engines
        ],
        snapshot=dict(window.snapshot),
        lock=window.lock,
    )


def eval_response(fleet: Any) -> EvalFleetResponse:
    if fleet is None:
        return EvalFleetResponse(ok=False, skip_reason="not_configured")
    data = fleet.to_dict() if hasattr(fleet, "to_dict") else dict(fleet)
    return EvalFleetResponse.model_validate(data)


class ControlServer:
    """The aiohttp application; collaborators are injected so tests can use stubs."""

    def __init__(
        self,
        registry: JobRegistry,
        authorizer: Authorizer,
        is_leader: Callable[[], bool],
        leader_name: Callable[[], str | None] = lambda: None,
        job_exists: Callable[[str, str], Awaitable[dict[str, Any] | None]] | None = None,
        watches: Callable[[str], bool] = lambda _ns: True,
        metrics: Metrics | None = None,
    ) -> None:
        self.registry = registry
        self.authorizer = authorizer
        self.is_leader = is_leader
        self.leader_name = leader_name
        self.job_exists = job_exists
        self.watches = watches
        self.metrics = metrics or Metrics()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_route("POST", JOB_ROUTE, self._handle)
        app.router.add_route("GET", JOB_ROUTE, self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        verb = request.match_info["verb"]
        started = time.perf_counter()
        try:
            resp = await self._serve(request, verb)
        except Exception as e:  # every failure becomes a JSON error with a reason
            err = error_for(e)
            if err.status >= 500 and err.status != 503:
                log.warning("controller API %s failed: %s", verb, err.message, extra={"verb": verb, "status": err.status})
            resp = err.response()
        self.metrics.api_calls.labels(verb, str(resp.status)).inc()
        self.metrics.api_seconds.labels(verb).observe(time.perf_counter() - started)
        return resp

    async def _serve(self, request: web.Request, verb: str) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        handler = self._verbs().get(verb)
        if handler is None:
            raise ApiError(404, "UnknownVerb", f"unknown verb {verb!r}; one of {sorted(self._verbs())}")
        method, fn = handler
        if request.method != method and not (verb == "eval_fleet"):
            raise ApiError(405, "MethodNotAllowed", f"{verb} takes {method}")
        if not self.is_leader():
            leader = self.leader_name()
            where = f" (leader: {leader})" if leader else ""
            raise ApiError(503, "NotLeader", f"this operator replica is a standby{where}; retry", retry_after=RETRY_AFTER_S)
        decision = await self.authorizer.authorize(request.headers.get("Authorization"), ns, name)
        if not decision.allowed:
            retry = RETRY_AFTER_S if decision.http_status == 503 else None
            raise ApiError(decision.http_status, decision.reason, decision.message, retry_after=retry)
        if not self.watches(ns):
            raise ApiError(404, "NotWatched", f"this operator does not watch namespace {ns!r}")
        handle = self.registry.get(ns, name)
        if handle is None:
            raise await self._no_controller(ns, name)
        body = await self._body(request)
        out = await fn(handle, body)
        return web.json_response(out.to_wire() if isinstance(out, BaseModel) else out)

    async def _no_controller(self, ns: str, name: str) -> ApiError:
        """Why a job has no running controller here, as an answer the client can act on."""
        job = await self.job_exists(ns, name) if self.job_exists is not None else None
        if job is None:
            return ApiError(404, "JobNotFound", f"RLJob {ns}/{name} not found")
        phase = (job.get("status") or {}).get("phase")
        if (job.get("spec") or {}).get("suspend"):
            return ApiError(409, "Suspended", f"RLJob {ns}/{name} is suspended (spec.suspend); its engines are stopped")
        if phase in ("Succeeded", "Failed"):
            return ApiError(409, "Finished", f"RLJob {ns}/{name} has {phase.lower()}; its engines are stopped")
        return ApiError(503, "ControllerStarting", f"the controller of {ns}/{name} is starting", retry_after=1)

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        if request.method == "GET" or not request.can_read_body:
            return {}
        try:
            data = await request.json()
        except json.JSONDecodeError as e:
            raise ApiError(400, "BadRequest", f"body is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "body must be a JSON object")
        return data

    def _verbs(self) -> dict[str, tuple[str, Callable[[JobHandle, dict[str, Any]], Awaitable[Any]]]]:
        return {
            "prepare_rollout": ("POST", self.prepare_rollout),
            "offload": ("POST", self.offload),
            "onload": ("POST", self.onload),
            "start_update_weights": ("POST", self.start_update_weights),
            "end_update_weights": ("POST", self.end_update_weights),
            "abort_update_weights": ("POST", self.abort_update_weights),
            "cells": ("GET", self.cells),
            "eval_fleet": ("POST", self.eval_fleet),
        }

    # ---------------------------------------------------------------- verbs
    async def prepare_rollout(self, job: JobHandle, body: dict[str, Any]) -> CellsResponse:
        req = PrepareRolloutRequest.model_validate(body)
        await job.controller.prepare_rollout(req.rollout_id)
        await job.publish("prepare_rollout")
        return cells_response(job.controller)

    async def offload(self, job: JobHandle, body: dict[str, Any]) -> CellsResponse:
        req = TagsRequest.model_validate(body)
        await job.controller.offload(req.tags)
        await job.publish("offload")
        return cells_response(job.controller)

    async def onload(self, job: JobHandle, body: dict[str, Any]) -> CellsResponse:
        req = TagsRequest.model_validate(body)
        await job.controller.onload(req.tags)
        await job.publish("onload")
        return cells_response(job.controller)

    async def start_update_weights(self, job: JobHandle, body: dict[str, Any]) -> UpdateWindowResponse:
        req = StartUpdateRequest.model_validate(body)
        window = await job.controller.start_update_weights(req.holder)
        try:
            await job.publish("start_update_weights")
        except Exception:
            # The lock must be in status before the trainer may push; if that write fails,
            # give the lock back so nobody pushes into a window a failover would forget.
            await job.controller.abort_update_weights(window.snapshot)
            raise
        return window_response(window)

    async def end_update_weights(self, job: JobHandle, body: dict[str, Any]) -> CellsResponse:
        req = EndUpdateRequest.model_validate(body)
        lock = job.controller.status_patch().get("lock") or {}
        await job.controller.end_update_weights(req.snapshot, weight_version=req.weight_version)
        await job.publish("end_update_weights")
        if lock.get("since"):
            self.metrics.weight_update_seconds.labels(job.namespace, job.name).observe(
                max(0.0, time.time() - parse_iso(lock["since"]))
            )
        return cells_response(job.controller)

    async def abort_update_weights(self, job: JobHandle, body: dict[str, Any]) -> AbortUpdateResponse:
        req = AbortUpdateRequest.model_validate(body)
        stopped = await job.controller.abort_update_weights(req.snapshot)
        await job.publish("abort_update_weights")
        return AbortUpdateResponse(stopped=list(stopped or []))

    async def cells(self, job: JobHandle, body: dict[str, Any]) -> CellsResponse:
        return cells_response(job.controller)

    async def eval_fleet(self, job: JobHandle, body: dict[str, Any]) -> EvalFleetResponse:
        fn = getattr(job.controller, "eval_fleet", None)
        if fn is None:
            return EvalFleetResponse(ok=False, skip_reason="not_configured")
        return eval_response(await fn())


def ops_app(metrics: Metrics, healthy: Callable[[], tuple[bool, str]]) -> web.Application:
    """/metrics and /healthz; both answer on standbys too (a standby is healthy)."""

    async def get_metrics(_req: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def get_healthz(_req: web.Request) -> web.Response:
        ok, detail = healthy()
        return web.json_response({"ok": ok, "detail": detail}, status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", get_healthz)
    return app
