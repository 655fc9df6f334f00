"""`rljob-operator`: leader election, the controller API, /metrics + /healthz, and kopf.

Startup order matters:
1. the HTTP servers start at once on every replica: a standby answers the controller API
   with 503 + Retry-After and is healthy;
2. the Lease loop runs; only once this replica holds the Lease does kopf start (so no
   handler, daemon or status write ever runs on a standby);
3. when the Lease is lost (cannot renew within the renew deadline, or a conflict shows
   another holder), kopf is stopped and the process exits with status 1: the Deployment
   restarts it as a fresh standby, which is simpler and safer than re-arming kopf in-process.
A clean shutdown (SIGTERM) stops kopf, releases the Lease so a standby takes over at once,
and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

import aiohttp
import kopf
from aiohttp import web

from controller_runtime.ports import Platform
from rljob_operator import handlers  # noqa: F401  (registers the kopf handlers)
from rljob_operator import labels as L
from rljob_operator.audit_stream import configure_audit
from rljob_operator.auth import Authorizer
from rljob_operator.child_versions import MAX_AGE_SECONDS, WATCHED_KINDS, ChildVersions
from rljob_operator.controller_api import ControlServer, ops_app
from rljob_operator.handlers import OperatorContext, engine_pod_event, kopf_settings
from rljob_operator.kube.connection import ApiConnection, connect
from rljob_operator.kube.kopf_watch import keep_managed_fields_out_of_kopf
from rljob_operator.kube.kubeapi import USER_AGENT, KubeApi
from rljob_operator.kube.list_watch import ListWatch
from rljob_operator.leader import LeaderElector
from rljob_operator.leader_thread import ElectorThread
from rljob_operator.lease_store import KubeLeaseStore
from rljob_operator.logging import configure_logging
from rljob_operator.metrics import Metrics
from rljob_operator.platform import POD_RELIST_SECONDS, KubernetesPlatform
from rljob_operator.pod_cache import EnginePodCache
from rljob_operator.registry import JobRegistry
from rljob_operator.relist import Relister
from rljob_operator.settings import OperatorSettings, load_settings
from rljob_operator.workload_cache import WorkloadCache
from rljob_operator.workload_watch import served_kinds, workload_watches

log = logging.getLogger("rljob_operator")

EXIT_LOST_LEADERSHIP = 1
# Threads (and connections) of the reconcile traffic's pool, shared by every job's passes. More
# threads drain the queue faster but, on a small machine, starve the Lease renewal past its deadline.
API_THREADS = 8
EVENT_THREADS = 1  # Events are for people: on a pool of their own, never ahead of a pass's calls


def controller_url(s: OperatorSettings) -> str:
    """How pods reach the controller API: explicit, else the chart's Service naming."""
    if s.controller_url:
        return s.controller_url
    ns = os.environ.get("POD_NAMESPACE") or s.effective_lease_namespace
    return f"http://rljob-operator.{ns}.svc:{s.api_port}"


def engine_pod_watch(
    s: OperatorSettings, kube: KubeApi, ctx: OperatorContext, metrics: Metrics, namespace: str | None
) -> ListWatch:
    """The watch of one namespace's engine pods (None: the cluster's), into the shared cache."""
    return ListWatch(
        kube,
        namespace,
        L.selector_string({L.ROLE: L.ROLE_ENGINE}),
        functools.partial(engine_pod_event, ctx),
        ctx.pods.resync,
        server_timeout=s.watch_server_timeout,
        client_timeout=s.watch_client_timeout,
        connect_timeout=s.watch_connect_timeout,
        count=metrics.count_pod_watch_event,
        count_restart=metrics.count_pod_watch_restart,
    )


def children_watches(
    s: OperatorSettings, kube: KubeApi, children: ChildVersions, namespace: str | None
) -> list[ListWatch]:
    """The watches of one namespace's children (None: the cluster's), one per watched kind, into
    the versions the children resync skips its reads by (`child_versions`)."""
    selector = L.selector_string({L.MANAGED_BY: L.MANAGER})
    return [
        ListWatch(
            kube,
            namespace,
            selector,
            functools.partial(children.record, kind),
            functools.partial(children.resync, kind),
            server_timeout=s.watch_server_timeout,
            client_timeout=s.watch_client_timeout,
            connect_timeout=s.watch_connect_timeout,
            api_version=api_version,
            kind=kind,
            what=f"{kind} watch (children)",
        )
        for api_version, kind in WATCHED_KINDS
    ]


def make_platform_factory(
    kube: KubeApi, pods: EnginePodCache, relist_seconds: float = POD_RELIST_SECONDS
) -> Callable[[dict[str, Any]], Platform]:
    """Each job's Platform, all on the process's one `KubeApi` and its one engine-pod cache."""

    def make(body: dict[str, Any]) -> Platform:
        return KubernetesPlatform(kube, body["metadata"]["namespace"], body, pods, relist_seconds=relist_seconds)

    return make


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = cast("asyncio.Server | None", site._server)  # aiohttp types it as AbstractServer
    bound = port
    if server is not None and server.sockets:  # port 0: report the one the OS picked
        bound = server.sockets[0].getsockname()[1]
    return runner, bound


def named_client(s: OperatorSettings, connections: int = 1) -> ApiConnection:
    """A connection whose requests name this replica (`rljob-operator/<identity>`), so every
    write shows in the API server's audit log with who made it (the reliability suite checks
    from there that only the Lease holder writes)."""
    return connect(s.kubeconfig, connections, user_agent=f"{USER_AGENT}/{s.identity}")


async def run_operator(s: OperatorSettings) -> int:
    metrics = Metrics()
    kube = KubeApi(named_client(s, API_THREADS), threads=API_THREADS, on_wait=metrics.observe_queue_wait)
    metrics.kube_api_queued.set_function(kube.queued)
    events_kube = KubeApi(named_client(s, EVENT_THREADS), threads=EVENT_THREADS)
    # The Lease gets a client and a thread of its own: on a slow API server, renewals queued
    # behind the reconcile traffic on the shared pool missed the renew deadline and the
    # replica gave up leading (tests/reliability/test_api_faults.py, one second per request).
    lease_kube = KubeApi(named_client(s), threads=1, request_timeout=s.renew_deadline_seconds)
    registry = JobRegistry()
    loop = asyncio.get_running_loop()
    leading, lost = asyncio.Event(), asyncio.Event()

    def started() -> None:
        metrics.leader.set(1)
        leading.set()

    def stopped() -> None:
        metrics.leader.set(0)
        lost.set()

    # called on the election's own loop (`leader_thread`): hand over to this one
    async def on_started() -> None:
        loop.call_soon_threadsafe(started)

    async def on_stopped() -> None:
        loop.call_soon_threadsafe(stopped)

    elector = LeaderElector(
        KubeLeaseStore(lease_kube, s.effective_lease_namespace, s.lease_name),
        s.identity,
        s.lease_duration_seconds,
        s.renew_deadline_seconds,
        s.retry_period_seconds,
        on_started_leading=on_started,
        on_stopped_leading=on_stopped,
    )
    election = ElectorThread(elector)

    async def job_exists(ns: str, name: str) -> dict[str, Any] | None:
        return await kube.get_rljob(ns, name)

    control = ControlServer(
        registry,
        Authorizer(kube, cache_seconds=s.auth_cache_seconds),
        is_leader=elector.is_leader,
        leader_name=lambda: elector.leader,
        job_exists=job_exists,
        watches=s.watches,
        metrics=metrics,
    )
    kopf_task: asyncio.Task[None] | None = None

    def healthy() -> tuple[bool, str]:
        if kopf_task is not None and kopf_task.done():
            return False, "kopf stopped"
        return True, "leader" if elector.is_leader() else "standby"

    await election.call(elector.tick())  # know the leader before answering: a standby's 503 names it
    api_runner, api_port = await start_site(control.app(), s.api_host, s.api_port)
    ops_runner, ops_port = await start_site(ops_app(metrics, healthy), s.metrics_host, s.metrics_port)
    log.info("listening", extra={"controller_api_port": api_port, "metrics_port": ops_port, "identity": s.identity})

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    election.start()
    exit_code = 0
    try:
        waiters: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(leading.wait()), asyncio.ensure_future(stop.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        if not stop.is_set():
            log.info("leading: starting kopf", extra={"identity": s.identity})
            kopf_stop = asyncio.Event()
            pods = EnginePodCache()
            children = ChildVersions((kind for _, kind in WATCHED_KINDS), MAX_AGE_SECONDS)
            # Engines are on private addresses (no ambient proxy); no connection limit: a hung
            # engine holds its connection for timeoutSeconds and must not queue other jobs' probes.
            engine_http = aiohttp.ClientSession(trust_env=False, connector=aiohttp.TCPConnector(limit=0))
            ctx = OperatorContext(
                settings=s,
                kube=kube,
                registry=registry,
                metrics=metrics,
                is_leader=elector.is_leader,
                make_platform=make_platform_factory(kube, pods, s.pod_relist_seconds),
                controller_url=controller_url(s),
                pods=pods,
                children=children,
                workloads=WorkloadCache(),
                engine_http=engine_http,
                events=events_kube,
            )
            keep_managed_fields_out_of_kopf()
            kopf_task = asyncio.create_task(
                kopf.operator(
                    settings=kopf_settings(s),
                    standalone=True,
                    clusterwide=s.clusterwide,
                    namespaces=list(s.namespaces),
                    memo=ctx,
                    stop_flag=kopf_stop,
                ),
                name="kopf",
            )
            # The engine pods' and the children's watches are ours (`list_watch`), not kopf's: one
            # per watched namespace (and child kind).
            pod_stop = asyncio.Event()
            watched: list[str | None] = [None] if s.clusterwide else list(s.namespaces)
            pod_watches = [engine_pod_watch(s, kube, ctx, metrics, ns) for ns in watched]
            pod_tasks = [asyncio.create_task(w.run(pod_stop), name="pod-watch") for w in pod_watches]
            pod_tasks += [asyncio.create_task(w.run(pod_stop), name="children-watch")
                          for ns in watched for w in children_watches(s, kube, children, ns)]  # fmt: skip
            followed = await served_kinds(kube)  # referenced trainer workloads: the kinds served now
            pod_tasks += [asyncio.create_task(w.run(pod_stop), name="workload-watch")
                          for ns in watched for w in workload_watches(s, kube, ctx, ns, followed)]  # fmt: skip
            relister = Relister(kube, ctx.runtimes, watched,
                                s.relist_seconds, acting=elector.is_leader, delivered=ctx.delivered)  # fmt: skip
            relist_stop = asyncio.Event()
            relist_task = asyncio.create_task(relister.run(relist_stop), name="relist")
            # kopf installs its own SIGINT/SIGTERM handlers (they stop kopf); ours stay for the rest.
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait()), kopf_task]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters[:2]:
                w.cancel()
            if lost.is_set():
                log.error("lost the leader Lease: stopping kopf and exiting", extra={"identity": s.identity})
                exit_code = EXIT_LOST_LEADERSHIP
            elif kopf_task.done() and not kopf_task.cancelled() and kopf_task.exception() is not None:
                log.error("kopf stopped with an error: %r", kopf_task.exception())
                exit_code = EXIT_LOST_LEADERSHIP
            relist_stop.set()
            pod_stop.set()
            kopf_stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(kopf_task, timeout=60)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(relist_task, timeout=60)
            for task in pod_tasks:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(task, timeout=60)
            await engine_http.close()
    finally:
        await election.stop()
        if exit_code == 0:
            await election.call(elector.release())
        election.close()
        await api_runner.cleanup()
        await ops_runner.cleanup()
        kube.close()
        events_kube.close()
        lease_kube.close()
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    try:
        s = load_settings(argv)
    except Exception as e:  # pydantic's message names the flag
        print(f"rljob-operator: {e}", file=sys.stderr)
        return 2
    configure_logging(s.log_level, s.log_format)
    configure_audit(s.audit_log_file)
    return asyncio.run(run_operator(s))


if __name__ == "__main__":
    sys.exit(main())
