"""The operator's own engine-pod watch (`list_watch`): the LIST pages, the watch from the list's
version, bookmarks, `410 Gone` and a stalled stream, against an HTTP server on loopback that
answers as the API server does; and the cache's view after a re-list.

The same watch against the real API server (with a 410 and a stalled stream injected by a
proxy) is `tests/reliability/test_api_faults.py::test_the_engine_pod_watch_survives_a_410_and_a_stall`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kopf
import pytest
from aiohttp import web
from rljob_operator import labels as L
from rljob_operator.kube.connection import ApiConnection
from rljob_operator.kube.kubeapi import KubeApi, KubeApiError
from rljob_operator.kube.list_watch import Gone, ListWatch, decode, split_lines
from rljob_operator.pod_cache import EnginePodCache

SELECTOR = f"{L.ROLE}={L.ROLE_ENGINE}"


def pod(name: str, rv: int, job: str = "j", namespace: str = "rl") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv),
                     "labels": {L.JOB: job, L.ROLE: L.ROLE_ENGINE}},
        "status": {"phase": "Running"},
    }  # fmt: skip


def line(type_: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": type_, "object": obj}).encode() + b"\n"


def test_lines_split_across_chunks_and_blank_lines_are_skipped() -> None:
    lines, rest = split_lines(b'{"a"', b':1}\n\n{"b":2}\n{"c"')
    assert lines == [b'{"a":1}', b'{"b":2}'] and rest == b'{"c"'


def test_an_error_event_of_410_is_gone_and_any_other_error_is_an_api_error() -> None:
    with pytest.raises(Gone):
        decode(line("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"}))
    with pytest.raises(KubeApiError) as e:
        decode(line("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"}))
    assert e.value.status == 500
    assert decode(line("BOOKMARK", {"metadata": {"resourceVersion": "9"}})).version == "9"


def test_a_relist_drops_pods_it_lacks_unless_newer_and_only_in_its_namespace() -> None:
    cache = EnginePodCache()
    for p in (pod("a", 5), pod("b", 6), pod("late", 30), pod("other", 4, namespace="ns2")):
        cache.record("ADDED", p)
    listed = [pod("a", 7)]
    for p in listed:
        cache.record(None, p)
    cache.resync("rl", listed, 20)
    assert sorted(p["metadata"]["name"] for p in cache.pods("rl", "j")) == ["a", "late"]
    assert [p["metadata"]["name"] for p in cache.pods("ns2", "j")] == ["other"]
    cache.resync(None, [], 20)  # a cluster-wide list that lacks every pod: all but the newer go
    assert [p["metadata"]["name"] for p in cache.pods("rl", "j")] == ["late"]
    assert cache.pods("ns2", "j") == []


class StandInApiServer:
    """The pod LIST and WATCH of an API server: a script of watch answers, one per request."""

    def __init__(self) -> None:
        self.pods = {"p0": pod("p0", 10), "p1": pod("p1", 11), "p2": pod("p2", 12)}
        self.list_version = 12
        self.watches: list[Any] = []  # per watch request: lines, a function making them, "gone" or "stall"
        self.requests: list[dict[str, str]] = []
        self.stalls: asyncio.Queue[int] = asyncio.Queue()  # the index of each watch request that stalls
        self.closing = asyncio.Event()  # ends the stalled streams

    async def handle(self, request: web.Request) -> web.StreamResponse:
        q = dict(request.query)
        self.requests.append(q)
        assert request.headers["Authorization"] == "Bearer t0k3n"
        assert q["labelSelector"] == SELECTOR
        if q.get("watch") != "true":  # a LIST, two pods per page
            names = sorted(self.pods)
            start = int(q.get("continue") or 0)
            page = names[start : start + 2]
            meta: dict[str, Any] = {"resourceVersion": str(self.list_version)}
            if start + 2 < len(names):
                meta["continue"] = str(start + 2)
            return web.json_response({"kind": "PodList", "metadata": meta, "items": [self.pods[n] for n in page]})
        script = self.watches.pop(0) if self.watches else "stall"
        if callable(script):
            script = script()
        if script == "gone":
            return web.json_response({"kind": "Status", "code": 410, "reason": "Expired"}, status=410)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        if script == "stall":  # headers, then silence until the test ends
            self.stalls.put_nowait(sum(1 for r in self.requests if r.get("watch") == "true"))
            await self.closing.wait()
            return resp
        for raw in script:
            await resp.write(raw)
        await resp.write_eof()
        return resp


@contextlib.asynccontextmanager
async def stand_in() -> AsyncIterator[tuple[StandInApiServer, str]]:
    """Started in the test's own loop (an async fixture may get a loop of its own)."""
    s = StandInApiServer()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/rl/pods", s.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield s, f"http://127.0.0.1:{port}"
    finally:
        s.closing.set()
        await runner.cleanup()


async def test_the_watch_lists_in_pages_resumes_from_the_last_version_and_lists_again_after_410() -> None:
    async with stand_in() as (api, url):
        await _lists_in_pages_resumes_and_lists_again_after_410(api, url)


async def _lists_in_pages_resumes_and_lists_again_after_410(api: StandInApiServer, url: str) -> None:

    def compacted_after_changes() -> list[bytes]:  # p2 deleted, p4 created while the watch was away
        api.pods = {"p0": pod("p0", 14), "p1": pod("p1", 11), "p3": pod("p3", 13), "p4": pod("p4", 25)}
        api.list_version = 30
        return [line("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"})]

    api.watches = [
        # the first watch: a new pod, a change, a bookmark, then the server's timeout ends it
        [line("ADDED", pod("p3", 13)), line("MODIFIED", pod("p0", 14)), line("BOOKMARK", {"metadata": {"resourceVersion": "20"}})],
        "gone",  # the next one's version was compacted away: list again
        compacted_after_changes,  # the same as an ERROR event, the pods changed meanwhile
        [line("DELETED", pod("p1", 31))],
    ]  # fmt: skip
    kube = KubeApi(ApiConnection(kopf.ConnectionInfo(server=url, token="t0k3n")), threads=1)
    cache, events, restarts = EnginePodCache(), Counter[str](), Counter[str]()
    woken: list[tuple[str | None, str]] = []

    def on_event(type_: str | None, body: dict[str, Any]) -> None:
        cache.record(type_, body)
        woken.append((type_, body["metadata"]["name"]))

    watch = ListWatch(kube, "rl", SELECTOR, on_event, cache.resync, server_timeout=5, client_timeout=30,
                     connect_timeout=5, count=lambda t: events.update([t]), count_restart=lambda r: restarts.update([r]))  # fmt: skip

    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    assert await asyncio.wait_for(api.stalls.get(), 20) == 5  # the script used up: the next one stalls
    stop.set()
    await asyncio.wait_for(task, 10)
    kube.close()

    watches = [r for r in api.requests if r.get("watch") == "true"]
    lists = [r for r in api.requests if r.get("watch") != "true"]
    assert [r["resourceVersion"] for r in watches] == ["12", "20", "12", "30", "31"]
    assert all(r["allowWatchBookmarks"] == "true" and r["timeoutSeconds"] == "5" for r in watches)
    assert [r.get("continue") for r in lists] == [None, "2", None, "2", None, "2"]  # three LISTs of two pages
    assert sorted(p["metadata"]["name"] for p in cache.pods("rl", "j")) == ["p0", "p3", "p4"]  # p2 dropped, p1 deleted
    assert events["LISTED"] == 3 + 3 + 4
    assert events["ADDED"] == 1 and events["MODIFIED"] == 1 and events["DELETED"] == 1 and events["BOOKMARK"] == 1
    assert restarts["gone"] == 2 and restarts["ended"] == 2
    assert ("DELETED", "p1") in woken and (None, "p4") in woken


async def test_a_stalled_watch_is_given_up_at_the_client_timeout_and_resumed() -> None:
    async with stand_in() as (api, url):
        await _stalled_watch_given_up_and_resumed(api, url)


async def _stalled_watch_given_up_and_resumed(api: StandInApiServer, url: str) -> None:
    api.watches = ["stall", [line("ADDED", pod("p9", 40))]]
    kube = KubeApi(ApiConnection(kopf.ConnectionInfo(server=url, token="t0k3n")), threads=1)
    cache, restarts = EnginePodCache(), Counter[str]()
    watch = ListWatch(kube, "rl", SELECTOR, cache.record, cache.resync, server_timeout=60, client_timeout=0.5,
                     connect_timeout=5, count_restart=lambda r: restarts.update([r]))  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    assert await asyncio.wait_for(api.stalls.get(), 20) == 1
    assert await asyncio.wait_for(api.stalls.get(), 20) == 3  # given up, resumed (p9), then the next
    assert [p["metadata"]["name"] for p in cache.pods("rl", "j")] == ["p0", "p1", "p2", "p9"]
    stop.set()
    await asyncio.wait_for(task, 10)  # a stop during the next (stalled) request ends it at once
    kube.close()
    assert restarts["timeout"] == 1
    assert [r["resourceVersion"] for r in api.requests if r.get("watch") == "true"][:2] == ["12", "12"]


async def test_an_event_that_breaks_its_handler_does_not_end_the_watch() -> None:
    async with stand_in() as (api, url):
        api.watches = [[line("ADDED", pod("p9", 40))], [line("ADDED", pod("p9", 40))]]  # resumed: sent again
        kube = KubeApi(ApiConnection(kopf.ConnectionInfo(server=url, token="t0k3n")), threads=1)
        cache, restarts, failed = EnginePodCache(), Counter[str](), []

        def on_event(type_: str | None, body: dict[str, Any]) -> None:
            if type_ == "ADDED" and not failed:
                failed.append(body["metadata"]["name"])
                raise KeyError("a bug in the handler")
            cache.record(type_, body)

        watch = ListWatch(kube, "rl", SELECTOR, on_event, cache.resync, server_timeout=60, client_timeout=30,
                         connect_timeout=5, count_restart=lambda r: restarts.update([r]))  # fmt: skip
        stop = asyncio.Event()
        task = asyncio.create_task(watch.run(stop))
        assert await asyncio.wait_for(api.stalls.get(), 20) == 3
        stop.set()
        await asyncio.wait_for(task, 10)
        kube.close()
        assert failed == ["p9"] and restarts["error"] == 1
        assert "p9" in {p["metadata"]["name"] for p in cache.pods("rl", "j")}


async def test_a_watch_refused_with_401_logs_in_again_so_that_the_next_try_carries_new_credentials() -> None:
    """The LIST's calls renew an expired login themselves (`connection`); the watch, on the
    event loop, tells the connection and backs off, and its next request carries the new token."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Bearer fresh":
            return web.json_response({"kind": "Status", "code": 401, "message": "Unauthorized"}, status=401)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/rl/pods", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    logins: list[str] = []

    def login() -> kopf.ConnectionInfo:
        logins.append("fresh")
        return kopf.ConnectionInfo(server=url, token="fresh")

    kube = KubeApi(ApiConnection(kopf.ConnectionInfo(server=url, token="stale"), login=login), threads=1)
    watch = ListWatch(kube, "rl", SELECTOR, lambda *_: None, lambda *_: None,
                      server_timeout=5, client_timeout=5, connect_timeout=5)  # fmt: skip
    watch.version = "7"
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(KubeApiError) as refused:
                await watch.watch(session, False)
            assert refused.value.status == 401 and logins == ["fresh"]
            await watch.watch(session, False)  # the retry: accepted
        assert seen == ["Bearer stale", "Bearer fresh"]
    finally:
        kube.close()
        await runner.cleanup()
