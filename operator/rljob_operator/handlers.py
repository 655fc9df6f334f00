"""kopf wiring: one daemon per RLJob, a wake-up on every watch event, operator settings; and
what an engine pod's event does (the pod watch is ours, `list_watch`, not kopf's).

Level-based on purpose (kopf's docs/reconciliation.rst): no create/update handlers whose
missed edges would lose work. The daemon of a job runs the `JobRuntime` loop for as long as
the RLJob exists and this replica leads; each watch event only pokes that loop awake. A
restart or failover starts the daemons afresh and they converge from the cluster and the
RLJob status.

kopf runs only while this replica holds the leader Lease (see `main`): kopf's peering is
not leader election. As a second guard every pass checks leadership before acting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import kopf

from controller_runtime.ports import Platform
from rljob_operator import labels as L
from rljob_operator.child_versions import ChildVersions
from rljob_operator.delivered import Delivered, record_delivered
from rljob_operator.event_recorder import EventSink
from rljob_operator.kinds import GROUP, PLURAL, VERSION
from rljob_operator.kube.kubeapi import KubeApi
from rljob_operator.kube.kubeconfig import connection_info
from rljob_operator.manifests import PolicyPeers
from rljob_operator.metrics import Metrics
from rljob_operator.pod_cache import EnginePodCache
from rljob_operator.reconcile.job_runtime import JobRuntime
from rljob_operator.registry import JobRegistry
from rljob_operator.settings import OperatorSettings
from rljob_operator.workload_cache import WorkloadCache

log = logging.getLogger(__name__)

FINALIZER = f"{GROUP}/operator"
ANNOTATION_PREFIX = GROUP


@dataclass
class OperatorContext:
    """Everything handlers need, handed to kopf as `memo` (copied shallowly per object)."""

    settings: OperatorSettings
    kube: KubeApi
    registry: JobRegistry
    metrics: Metrics
    is_leader: Callable[[], bool]
    make_platform: Callable[[dict[str, Any]], Platform]
    controller_url: str
    pods: EnginePodCache = field(default_factory=EnginePodCache)  # what the engine-pod watch saw, for every job
    children: ChildVersions | None = None  # the children's versions as watched (main); None: always read
    workloads: WorkloadCache | None = None  # referenced trainer workloads as watched (main); None: always read
    runtimes: dict[tuple[str, str], JobRuntime] = field(default_factory=dict)
    delivered: dict[tuple[str, str], Delivered] = field(default_factory=dict)  # the relist reads it
    engine_http: aiohttp.ClientSession | None = None  # every job's engine probes and calls (main)
    events: EventSink | None = None  # where Events go (main: a pool apart from `kube`); None: `kube`


def policy_peers(s: OperatorSettings) -> PolicyPeers:
    """Who each job's NetworkPolicies admit besides its own pods: this operator and the scraper."""
    return PolicyPeers(s.effective_operator_namespace, s.metrics_scraper_namespace, s.metrics_scraper_pod_labels)


def kopf_settings(s: OperatorSettings) -> kopf.OperatorSettings:
    """kopf settings chosen against watch stalls and for where kopf keeps its own state."""
    ks = kopf.OperatorSettings()
    # A watch that silently stops delivering events is the classic kopf stall: bound every
    # watch request on the server and the client side, and the TCP connect.
    ks.watching.server_timeout = int(s.watch_server_timeout)  # the API server wants an integer
    ks.watching.client_timeout = s.watch_client_timeout
    ks.watching.connect_timeout = s.watch_connect_timeout
    ks.networking.request_timeout = 30.0
    ks.networking.connect_timeout = 10.0
    # kopf's bookkeeping goes into annotations under our prefix, not into status: status is
    # ours alone (the CRD's status schema would prune status.kopf anyway).
    ks.persistence.finalizer = FINALIZER
    ks.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    ks.persistence.diffbase_storage = LeanDiffBaseStorage(prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    # Leader election replaces peering: never wait for or write KopfPeering objects.
    ks.peering.standalone = True
    ks.posting.level = logging.WARNING  # only kopf's own warnings become Events; ours are explicit
    ks.process.ultimate_exiting_timeout = 30.0
    return ks


class LeanDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotations diff base, built without deep-copying what it then throws away.

    kopf builds an RLJob's "essence" (spec, labels, annotations) on every watch event by
    deep-copying the whole body and then deleting `metadata` and `status`. Most RLJob events are
    our own status writes, and the status (one entry per cell) and managedFields are most of the
    body, so that copy is a large share of the event loop's busy time, which the controller API's
    answers wait behind. The essence is
    the same: kopf's own `build` runs on the body less `status` and with only the metadata it
    keeps (labels, annotations); with extra fields (a handler watching a status field; ours
    watch none) the whole body goes to kopf as before."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        fields = list(extra_fields or ())
        if fields:
            return super().build(body=body, extra_fields=fields)
        meta = body.get("metadata") or {}
        lean = {k: v for k, v in body.items() if k not in ("metadata", "status")}
        lean["metadata"] = {k: meta[k] for k in ("labels", "annotations") if k in meta}
        return super().build(body=kopf.Body(cast(kopf.RawBody, lean)), extra_fields=None)


@kopf.on.login(id="credentials")
def login(memo: Any = None, **_: Any) -> kopf.ConnectionInfo:
    """kopf's watches log in with the credentials the operator's own calls use (`kube.kubeconfig`);
    kopf calls this again when they expire (an exec plugin's token) or the API server answers 401."""
    return connection_info(getattr(getattr(memo, "settings", None), "kubeconfig", None))


@kopf.daemon(GROUP, VERSION, PLURAL, id="rljob", cancellation_timeout=30.0, backoff=5.0)
async def run_rljob(body: kopf.Body, stopped: kopf.DaemonStopped, memo: Any, **_: Any) -> None:
    """The per-job loop: children, suspension, engines (InferenceController), status."""
    ctx: OperatorContext = memo
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    if not ctx.is_leader():  # kopf runs only while leading; this is the second guard
        await stopped.wait()
        return
    rt = JobRuntime(
        body=body,
        kube=ctx.kube,
        platform=ctx.make_platform(dict(body)),
        registry=ctx.registry,
        metrics=ctx.metrics,
        controller_url=ctx.controller_url,
        resync_seconds=ctx.settings.resync_seconds,
        acting=ctx.is_leader,
        session=ctx.engine_http,
        events=ctx.events,
        child_versions=ctx.children,
        children_resync_seconds=ctx.settings.children_resync_seconds,
        peers=policy_peers(ctx.settings),
        workloads=ctx.workloads,
    )
    ctx.runtimes[key] = rt
    try:
        await rt.run(stopped)
    finally:
        if ctx.runtimes.get(key) is rt:
            del ctx.runtimes[key]
            if ctx.workloads is not None:
                ctx.workloads.forget(key)


@kopf.on.event(GROUP, VERSION, PLURAL, id="wake")
async def wake_rljob(
    type: str | None, name: str, namespace: str | None, body: kopf.Body, memo: Any, **_: Any
) -> None:
    """A change of the RLJob (spec edit, suspend, labels) wakes its loop at once; a status-only
    event (the operator's own write coming back) does not (`job_runtime.wake_key`). Every event
    is recorded for the relist: a job kopf has an event of is not one its watch lost, even
    before kopf spawns its daemon (`relist.plan`)."""
    record_delivered(memo.delivered, type, body)
    rt = memo.runtimes.get((namespace, name))
    if rt is not None:
        rt.poke_for(body)


def wake_jobs(ctx: OperatorContext, jobs: Iterable[tuple[str, str]]) -> None:
    """Wake the loops of these RLJobs (namespace, name) that run here."""
    for key in jobs:
        rt = ctx.runtimes.get(key)
        if rt is not None:
            rt.poke()


def workload_event(ctx: OperatorContext, kind: str, type: str | None, body: dict[str, Any]) -> None:
    """A referenced kind's object changed (`main.workload_watches`): cached, and the jobs whose
    workloadRef names it wake (their trainer may have finished)."""
    if ctx.workloads is not None:
        wake_jobs(ctx, ctx.workloads.record(kind, type, body))


def workloads_listed(ctx: OperatorContext, kind: str, namespace: str | None, objs: list[dict[str, Any]], _v: int | None) -> None:
    """A complete LIST of a referenced kind: the cache is trusted there; jobs whose workload went wake."""
    if ctx.workloads is not None:
        wake_jobs(ctx, ctx.workloads.resync(kind, namespace, objs))


def engine_pod_event(ctx: OperatorContext, type: str | None, body: dict[str, Any]) -> None:
    """An engine pod's change (`list_watch`) goes into the shared pod cache (the jobs' passes
    read their pods from it, `platform.KubernetesPlatform`), then wakes its job's loop when the
    loop waits for it (`job_runtime.pod_wakes_job`): pods are seen running at once, not at the
    next poll."""
    ctx.pods.record(type, body)
    meta = body.get("metadata") or {}
    job = (meta.get("annotations") or {}).get(L.JOB_NAME_ANNOTATION) or (meta.get("labels") or {}).get(L.JOB)
    rt = ctx.runtimes.get((str(meta.get("namespace") or ""), str(job or "")))
    if rt is not None:
        rt.poke_for_pod(body)
