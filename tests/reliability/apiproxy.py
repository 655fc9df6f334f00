"""A loopback HTTP proxy between the operator and the kube-apiserver that injects API faults.

Sieve (OSDI'22) and Acto (SOSP'23) find operator bugs by perturbing what a controller sees of
the API; they instrument Go clients. Here the same faults sit in a proxy: the operator's
kubeconfig points at `http://127.0.0.1:<port>` (no credentials), and the proxy forwards each
request to the real API server over TLS with the test cluster's admin certificate. Watches
are streamed through chunk by chunk.

A `Fault` matches requests (method, resource, watch or not) and does one thing to the first
`times` of them, after `skip` matching ones went through untouched: answer a status of its
own (429 with Retry-After, 500, 503, a watch's `410 Gone` event), reset the connection, delay
the request, stall a watch stream (headers sent, then nothing until the client gives up), or
call `after` once the k-th matching write was answered (a test SIGKILLs the operator there),
or answer a read with an older response (`stale`: the first answer to each path and query is
recorded, later matches get it again, an informer cache or an API server replica behind).
Two actions act on the events of a watch stream instead of on requests (`skip` and `times`
count events: ADDED, MODIFIED, DELETED, never BOOKMARK or ERROR; `event`, a test of the
event, narrows them): `drop` loses an event, `lag` holds it (and the stream behind it) back
for `seconds`. `outage(seconds)` emulates a
kube-apiserver restart: every open connection is cut and every request refused until it ends.
Faults are added and removed while the proxy runs; `matched`/`applied` count them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

EVENT_ACTIONS = ("drop", "lag")  # act on a watch stream's events, not on the request
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "authorization"}


@dataclass
class Fault:
    """What to do to matching requests; `times=0` means every match."""

    action: str  # status | reset | delay | stall | gone | after | stale | drop | lag
    method: str | None = None  # GET, POST, PATCH, PUT, DELETE (None: any)
    resource: str | None = None  # a path segment, e.g. "pods", "rljobs", "status"
    watch: bool | None = None  # only watches (True), never watches (False), either (None)
    status: int = 503
    retry_after: int | None = None
    seconds: float = 0.0
    skip: int = 0
    times: int = 1
    after: Callable[[], None] | None = None
    event: Callable[[dict[str, Any]], bool] | None = None  # drop/lag: only events this holds for
    matched: int = 0
    applied: int = 0
    recorded: dict[str, tuple[int, bytes, dict[str, str]]] = field(default_factory=dict)

    def matches(self, method: str, path: str, watch: bool) -> bool:
        if self.method and method != self.method:
            return False
        if self.resource and self.resource not in path.split("/"):
            return False
        return self.watch is None or self.watch == watch

    def take(self) -> bool:
        """Count one match; True when this one gets the fault."""
        self.matched += 1
        if self.matched <= self.skip or (self.times and self.applied >= self.times):
            return False
        self.applied += 1
        return True


@dataclass
class Upstream:
    server: str
    ssl: ssl.SSLContext

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Upstream:
        cfg = yaml.safe_load(path.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        ctx.load_cert_chain(user["client-certificate"], user["client-key"])
        return cls(cluster["server"], ctx)


@dataclass
class ApiProxy:
    upstream: Upstream
    faults: list[Fault] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _down_until: float = 0.0
    _open: set[asyncio.Transport] = field(default_factory=set)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ApiProxy:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="apiproxy", daemon=True)
        self._thread.start()
        assert ready.wait(30), "the API proxy did not start"
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        assert self._runner is not None
        for step in (self._runner.cleanup(), self._session.close()):
            with contextlib.suppress(TimeoutError):  # a stalled watch may outlive the shutdown
                asyncio.run_coroutine_threadsafe(step, self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(30)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig that reaches the API server through this proxy."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
        }  # fmt: skip
        path.write_text(yaml.safe_dump(cfg))
        return path

    def add(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    def clear(self) -> None:
        self.faults.clear()

    def outage(self, seconds: float) -> int:
        """A kube-apiserver restart as its clients see it: every open connection (watches
        included) is cut now, and every request is cut unanswered for `seconds`. Returns how
        many connections were open."""
        assert self._loop is not None

        async def cut() -> int:
            assert self._loop is not None
            self._down_until = self._loop.time() + seconds
            n = len(self._open)
            for transport in list(self._open):
                transport.abort()
            return n

        return asyncio.run_coroutine_threadsafe(cut(), self._loop).result(10)

    # ------------------------------------------------------------------ serving
    async def _serve(self) -> None:
        self._session = ClientSession(
            connector=TCPConnector(ssl=self.upstream.ssl), timeout=ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        if asyncio.get_running_loop().time() < self._down_until:
            request.transport.abort()  # the API server is restarting: nobody answers
            return web.Response(status=503)  # never reaches the client
        self._open.add(request.transport)
        try:
            return await self._handle_up(request)
        finally:
            self._open.discard(request.transport)

    async def _handle_up(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        matching = [f for f in list(self.faults) if f.matches(request.method, request.path, watch)]
        fault = next((f for f in matching if f.action not in EVENT_ACTIONS and f.take()), None)
        if fault is not None and fault.action == "stale":
            if request.path_qs in fault.recorded:
                status, body, headers = fault.recorded[request.path_qs]
                return web.Response(status=status, body=body, headers=headers)
            fault.applied -= 1  # nothing recorded yet for this read: it goes through (and is recorded)
        elif fault is not None and fault.action != "after":
            early = await self._inject(fault, request)
            if early is not None:
                return early
        response = await self._forward(request, watch)
        if fault is not None and fault.action == "after" and fault.after is not None:
            fault.after()
        if isinstance(response, web.Response) and response.body is not None and response.status == 200:
            for f in matching:  # a stale fault records the first answer to each read
                if f.action == "stale" and request.path_qs not in f.recorded:
                    f.recorded[request.path_qs] = (200, bytes(response.body), dict(response.headers))  # type: ignore[arg-type]
        return response

    async def _inject(self, fault: Fault, request: web.Request) -> web.StreamResponse | None:
        if fault.action == "delay":
            await asyncio.sleep(fault.seconds)
            return None
        if fault.action == "status":
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": fault.status,
                    "reason": "InjectedFault", "message": f"injected by the test's API proxy ({fault.status})"}  # fmt: skip
            return web.json_response(body, status=fault.status, headers=headers)
        if fault.action == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=500)  # never reaches the client: the connection is gone
        if fault.action == "gone":  # a watch whose resourceVersion etcd compacted away
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
                      "message": "too old resource version (injected)"}  # fmt: skip
            await resp.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
            await resp.write_eof()
            return resp
        if fault.action == "stall":  # headers, then silence: the TCP stream stays open
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await asyncio.sleep(fault.seconds or 3600)
            return resp
        raise ValueError(f"unknown fault action {fault.action!r}")

    def _event_faults(self, request: web.Request) -> list[Fault]:
        """The event faults of a watch, looked up per event: one added while the stream is
        open acts on its next events."""
        return [
            f
            for f in list(self.faults)
            if f.action in EVENT_ACTIONS and f.matches(request.method, request.path, True)
        ]

    async def _forward(self, request: web.Request, watch: bool) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read()
        url = self.upstream.server + request.path_qs
        async with self._session.request(request.method, url, headers=headers, data=body or None) as up:
            out_headers = {
                k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS | {"content-encoding"}
            }
            if not watch:
                data = await up.read()
                return web.Response(status=up.status, body=data, headers=out_headers)
            resp = web.StreamResponse(status=up.status, headers=out_headers)
            await resp.prepare(request)
            pending = b""
            async for chunk in up.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if await self._pass_event(line, self._event_faults(request)):
                        await resp.write(line + b"\n")
            if pending:
                await resp.write(pending)
            await resp.write_eof()
            return resp

    @staticmethod
    async def _pass_event(line: bytes, event_faults: list[Fault]) -> bool:
        """Whether one line of a watch stream goes on to the client (a `lag` holds it first)."""
        event: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
                return True
        fault = next((f for f in event_faults if (f.event is None or f.event(event)) and f.take()), None)
        if fault is None:
            return True
        if fault.action == "lag":
            await asyncio.sleep(fault.seconds)
            return True
        return False  # drop


def counts(proxy: ApiProxy) -> dict[str, Any]:
    return {f"{f.action}:{f.method}:{f.resource}": (f.matched, f.applied) for f in proxy.faults}
