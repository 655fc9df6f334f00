"""The operator's own watches: LIST, then WATCH from the list's resourceVersion, each event
straight into a cache. The engine pods' (into the pod cache, with a poke of the pod's job) and
the children's (their versions only, `child_versions`).

Why not kopf's watch: kopf runs every event of every watched object through its whole handling
machinery (a worker task and a queue per object, a memory of each object, the handler's
invocation with its kwargs built), where all a handler would do is file the pod into the cache
and poke a job. That machinery is a large share of the event loop during a ramp, whose events
are mostly engine pod events (several per pod, against a few status writes of the RLJob). Here
an event costs one JSON decode, one `EnginePodCache.record` and one dict lookup.

The protocol is client-go's reflector: list in pages (`limit`, `continue`; one page of a few
hundred pods at a time instead of every pod of the cluster in one answer), then watch from the
list's resourceVersion with bookmarks, each request bounded on the server (`timeoutSeconds`)
and the client (a stalled stream is given up); a watch that ends is resumed from the last
version seen; `410 Gone` (the version was compacted away) makes a new list, whose answer is the
newer view: a held pod it lacks is dropped (`EnginePodCache.resync`), as no DELETED event will
ever come for it. Any other failure is retried with a capped backoff, from the last version.

What a lost event costs is bounded elsewhere, as it was with kopf: a job's pass trusts the
cache only while its own expectations hold and lists its pods itself at least every
`--pod-relist-seconds` (`platform.KubernetesPlatform`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp

from rljob_operator.kube.kubeapi import KubeApi, KubeApiError, resource_path
from rljob_operator.kube.versions import list_version

log = logging.getLogger(__name__)

LIST_PAGE = 500  # pods per LIST page (client-go's reflector pages by 500 too)
BACKOFF_FIRST, BACKOFF_CAP = 0.5, 30.0

EventSink = Callable[[str | None, dict[str, Any]], None]  # (None for a listed object | ADDED | ..., object)
ListSink = Callable[[str | None, list[dict[str, Any]], int | None], None]  # (namespace, objects, version)
Counter = Callable[[str], None]  # a label value: an event type, or why the watch restarted


class Gone(Exception):
    """410: the resourceVersion the watch asked for was compacted away; list again."""


@dataclass(frozen=True)
class Line:
    """One decoded line of a watch stream."""

    type: str
    obj: dict[str, Any]

    @property
    def version(self) -> str | None:
        return (self.obj.get("metadata") or {}).get("resourceVersion")


def split_lines(pending: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of `pending + chunk`, and the rest (a line may span chunks, and a pod
    with large annotations can be longer than aiohttp's own line limit)."""
    *lines, rest = (pending + chunk).split(b"\n")
    return [line for line in lines if line.strip()], rest


def decode(line: bytes) -> Line:
    """A watch event; an ERROR event of status 410 raises `Gone`, any other ERROR raises
    `KubeApiError`, so that the caller lists again or backs off."""
    event = json.loads(line)
    kind, obj = str(event.get("type") or ""), event.get("object") or {}
    if kind == "ERROR":
        code = int(obj.get("code") or 0)
        if code == 410:
            raise Gone(str(obj.get("message") or "410 Gone"))
        raise KubeApiError("watch", code, str(obj.get("reason") or ""), json.dumps(obj))
    return Line(kind, obj)


class Backoff:
    """Capped doubling from `first`, back to `first` after a success."""

    def __init__(self, first: float = BACKOFF_FIRST, cap: float = BACKOFF_CAP) -> None:
        self.first, self.cap, self._next = first, cap, first

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._next = self.first


class ListWatch:
    """One namespace's (or, `namespace=None`, the cluster's) objects of `kind` and `selector`
    (pods unless told), kept current.

    `on_event` gets every object listed (type None) and every watch event (ADDED, MODIFIED,
    DELETED); `on_listed` gets each complete LIST with its resourceVersion, after its objects
    went to `on_event`, to drop what the list lacks. `count` is told each event type and each
    restart's reason (metrics)."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str | None,
        selector: str,
        on_event: EventSink,
        on_listed: ListSink,
        *,
        server_timeout: float,
        client_timeout: float,
        connect_timeout: float,
        count: Counter | None = None,
        count_restart: Counter | None = None,
        api_version: str = "v1",
        kind: str = "Pod",
        what: str = "engine pod watch",  # in its log lines
    ) -> None:
        self.kube, self.namespace, self.selector, self.what = kube, namespace, selector, what
        self.on_event, self.on_listed = on_event, on_listed
        self.server_timeout, self.client_timeout, self.connect_timeout = (
            server_timeout,
            client_timeout,
            connect_timeout,
        )
        self._count = count or (lambda _: None)
        self._count_restart = count_restart or (lambda _: None)
        self.version: str | None = None  # where the next watch starts; None: list first
        self.path = resource_path(api_version, kind, namespace)

    async def list(self) -> None:
        """Every object of the selector, page by page, then the list's version to watch from."""
        objs: list[dict[str, Any]] = []
        cont, version = "", None
        while True:
            query = [("labelSelector", self.selector), ("limit", str(LIST_PAGE))]
            if cont:
                query.append(("continue", cont))
            page = await self.kube.call("GET", self.path, query) or {}
            meta = page.get("metadata") or {}
            version = version or meta.get("resourceVersion")
            for obj in page.get("items") or []:
                self.on_event(None, obj)
                self._count("LISTED")
                objs.append(obj)
            cont = str(meta.get("continue") or "")
            if not cont:
                break
        self.on_listed(self.namespace, objs, list_version({"metadata": {"resourceVersion": version}}))
        self.version = version

    async def watch(self, session: aiohttp.ClientSession, ssl_context: ssl.SSLContext | bool) -> None:
        """One watch request, from `self.version`, until the server ends it."""
        query = {
            "watch": "true",
            "labelSelector": self.selector,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(int(self.server_timeout)),
            "resourceVersion": self.version or "",
        }
        headers = {"Accept": "application/json", "User-Agent": self.kube.api_client.user_agent}
        auth = self.kube.api_client.authorization()
        if auth:
            headers["Authorization"] = auth
        timeout = aiohttp.ClientTimeout(total=self.client_timeout, sock_connect=self.connect_timeout)
        url = self.kube.api_client.server + self.path
        async with session.get(url, params=query, headers=headers, ssl=ssl_context, timeout=timeout) as resp:
            if resp.status == 410:
                raise Gone(await resp.text())
            if resp.status == 401:  # an expired login: the next try carries a new one
                self.kube.api_client.unauthorized(auth)
            if resp.status != 200:
                raise KubeApiError(
                    f"GET {self.path} (watch)", resp.status, resp.reason or "", await resp.text()
                )
            pending = b""
            async for chunk in resp.content.iter_any():
                lines, pending = split_lines(pending, chunk)
                for raw in lines:
                    self._take(decode(raw))

    def _take(self, line: Line) -> None:
        self._count(line.type)
        if line.type in ("ADDED", "MODIFIED", "DELETED"):
            self.on_event(line.type, line.obj)
        if line.version:  # a BOOKMARK carries only the version
            self.version = line.version

    async def run(self, stop: asyncio.Event) -> None:
        """List and watch until `stop`; every failure is logged, counted and retried."""
        ssl_context: ssl.SSLContext | bool = self.kube.api_client.ssl_context or False
        backoff = Backoff()
        connector = aiohttp.TCPConnector(limit=1, force_close=False)
        async with aiohttp.ClientSession(trust_env=False, connector=connector) as session:
            while not stop.is_set():
                try:
                    if self.version is None:
                        await _until(stop, self.list())
                        if stop.is_set():
                            break
                    await _until(stop, self.watch(session, ssl_context))
                    backoff.reset()
                    if not stop.is_set():
                        self._count_restart("ended")  # the server's timeoutSeconds: resume at once
                    continue
                except Gone as e:
                    log.info("%s: %s; listing again", self.what, e, extra={"namespace": self.namespace})
                    self.version = None
                    self._count_restart("gone")
                    continue
                except TimeoutError:
                    reason = "timeout"
                except (KubeApiError, aiohttp.ClientError, OSError, ValueError) as e:
                    reason = "error"
                    log.warning("%s failed: %s", self.what, e, extra={"namespace": self.namespace})
                except Exception:  # a bug in handling one event must not end the watch for good
                    reason = "error"
                    log.exception("%s failed", self.what, extra={"namespace": self.namespace})
                self._count_restart(reason)
                delay = backoff.next()
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass


async def _until(stop: asyncio.Event, work: Coroutine[Any, Any, None]) -> None:
    """`work` (a coroutine), cancelled when `stop` is set first."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
    if task.done() and not task.cancelled():
        task.result()
