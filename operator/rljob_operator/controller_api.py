"""The controller API: the trainer side drives a job's InferenceController over HTTP.

Verbs and error answers are the tables in `controller_runtime.api` (`verbs`, `wire_errors`),
shared with local mode's server and the clients. Every call
is checked in this order: this replica leads (else 503 + Retry-After, so a client retries
against the Service until it reaches the leader), the caller is authenticated and
authorized (401 / 403), the job has a running controller here (404, or 503 while its daemon
is still starting). Then the controller method runs and its effect is written into the
RLJob `status` *before* the answer goes out, so a failover never loses an acknowledged step;
when that write fails the answer is 503 NotRecorded, and the client's repeat (which the
controller answers the same) writes it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from controller_runtime.api.base import ApiModel
from controller_runtime.api.control import API_PREFIX, UpdateWindowResponse
from controller_runtime.api.verbs import (
    Verb,
    cells_response,
    decode_body,
    dispatch,
    eval_response,
    verb_for,
    window_response,
)
from controller_runtime.api.wire_errors import (
    ControllerAPIError,
    ControllerForbidden,
    ControllerJobFinished,
    ControllerJobNotFound,
    ControllerJobSuspended,
    ControllerNotLeader,
    ControllerNotWatched,
    ControllerReviewUnavailable,
    ControllerStarting,
    ControllerUnauthenticated,
    answer_for,
    refusal,
)
from controller_runtime.clock import parse_iso
from controller_runtime.errors import EffectNotRecorded, PlatformError
from rljob_operator.auth import Authorizer, Decision
from rljob_operator.metrics import Metrics
from rljob_operator.registry import VERB_PUBLISHES, JobHandle, JobRegistry

log = logging.getLogger(__name__)

JOB_ROUTE = API_PREFIX + "/namespaces/{namespace}/rljobs/{name}/{verb}"

# The authorizer's refusals by status; their reasons are the table's (a test checks both agree).
_DENIED: dict[int, type[ControllerAPIError]] = {
    401: ControllerUnauthenticated,
    403: ControllerForbidden,
    503: ControllerReviewUnavailable,
}

__all__ = ["JOB_ROUTE", "ControlServer", "cells_response", "error_response", "eval_response", "ops_app",
           "window_response"]


def error_response(exc: BaseException) -> web.Response:
    """Any failure as the error table's answer (one place maps exceptions to HTTP, for both servers)."""
    answer = answer_for(exc)
    return web.json_response(answer.body.to_wire(), status=answer.status, headers=answer.headers or None)


def denied(decision: Decision) -> ControllerAPIError:
    cls = _DENIED.get(decision.http_status, ControllerForbidden)
    return refusal(cls, decision.message)


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
            resp = error_response(e)
            if resp.status >= 500 and (resp.status != 503 or isinstance(e, EffectNotRecorded)):
                log.warning("controller API %s failed: %s", verb, e, extra={"verb": verb, "status": resp.status})
        self.metrics.api_calls.labels(verb, str(resp.status)).inc()
        self.metrics.api_seconds.labels(verb).observe(time.perf_counter() - started)
        return resp

    async def _serve(self, request: web.Request, name: str) -> web.Response:
        ns, job = request.match_info["namespace"], request.match_info["name"]
        verb = verb_for(name, request.method)
        if not self.is_leader():
            leader = self.leader_name()
            where = f" (leader: {leader})" if leader else ""
            raise refusal(ControllerNotLeader, f"this operator replica is a standby{where}; retry")
        decision = await self.authorizer.authorize(request.headers.get("Authorization"), ns, job)
        if not decision.allowed:
            raise denied(decision)
        if not self.watches(ns):
            raise refusal(ControllerNotWatched, f"this operator does not watch namespace {ns!r}")
        handle = self.registry.get(ns, job)
        if handle is None:
            raise await self._no_controller(ns, job)
        body = decode_body(await request.text()) if request.method != "GET" and request.can_read_body else {}
        out = await self.run_verb(verb, handle, body)
        return web.json_response(out.to_wire())

    async def _no_controller(self, ns: str, name: str) -> ControllerAPIError:
        """Why a job has no running controller here, as an answer the client can act on."""
        job = await self.job_exists(ns, name) if self.job_exists is not None else None
        if job is None:
            return refusal(ControllerJobNotFound, f"RLJob {ns}/{name} not found")
        phase = (job.get("status") or {}).get("phase")
        if (job.get("spec") or {}).get("suspend"):
            return refusal(ControllerJobSuspended,
                           f"RLJob {ns}/{name} is suspended (spec.suspend); its engines are stopped")
        if phase in ("Succeeded", "Failed"):
            return refusal(ControllerJobFinished, f"RLJob {ns}/{name} has {phase.lower()}; its engines are stopped")
        return refusal(ControllerStarting, f"the controller of {ns}/{name} is starting")

    async def run_verb(self, verb: Verb, job: JobHandle, body: dict[str, Any]) -> ApiModel:
        """The table's call, then the effect written into status before the answer goes out."""
        lock_before = (job.controller.status_patch().get("lock") or {}) if verb.name == "end_update_weights" else {}
        if not verb.writes_status:
            return await dispatch(verb, job.controller, body)
        published = VERB_PUBLISHES.set(True)
        try:
            out = await dispatch(verb, job.controller, body)
        finally:
            VERB_PUBLISHES.reset(published)
        try:
            await job.publish(verb.name)
        except (PlatformError, TimeoutError) as exc:
            if isinstance(out, UpdateWindowResponse):
                # The lock must be in status before the trainer may push; if that write fails,
                # give the lock back so nobody pushes into a window a failover would forget.
                await job.controller.abort_update_weights(out.snapshot)
            raise EffectNotRecorded(verb.name, exc) from exc
        if verb.name == "end_update_weights" and lock_before.get("since"):
            self.metrics.weight_update_seconds.labels(job.namespace, job.name).observe(
                max(0.0, time.time() - parse_iso(lock_before["since"]))
            )
        return out


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
