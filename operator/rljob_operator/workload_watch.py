"""The watches of referenced trainer workloads (`workload_cache`): one per served kind and namespace.

Only kinds the API server serves when the operator starts are watched (asked once, by API
discovery): a kind whose CRD is absent would be a watch failing and retrying for good. Jobs that
reference a kind installed later are read with a GET each pass (`reconcile.workload_ref`).
"""

from __future__ import annotations

import functools
import logging

from controller_runtime.api.workloads import TRAINER_WORKLOADS, WorkloadKind
from rljob_operator.handlers import OperatorContext, workload_event, workloads_listed
from rljob_operator.kube.kubeapi import KubeApi, KubeApiError
from rljob_operator.kube.list_watch import ListWatch
from rljob_operator.settings import OperatorSettings
from rljob_operator.workload_cache import WorkloadCache

log = logging.getLogger(__name__)
RELIST_AFTER = ("error", "timeout")  # a failed watch: the cache is not trusted until it listed again


def served(resources: dict | None, row: WorkloadKind) -> bool:
    """Whether an APIResourceList (discovery of the row's group/version) has the row's resource."""
    return any(r.get("name") == row.plural for r in (resources or {}).get("resources") or [])


async def served_kinds(kube: KubeApi) -> list[WorkloadKind]:
    """The table's kinds the API server serves now."""
    out = []
    for row in TRAINER_WORKLOADS:
        base = "/api/v1" if row.api_version == "v1" else f"/apis/{row.api_version}"
        try:
            found = await kube.call("GET", base, ok=(404,))
        except KubeApiError as e:
            log.warning("discovery of %s failed (%s): its workloads are read each pass", row.api_version, e)
            continue
        if served(found, row):
            out.append(row)
    return out


def workload_watches(
    s: OperatorSettings, kube: KubeApi, ctx: OperatorContext, namespace: str | None, kinds: list[WorkloadKind]
) -> list[ListWatch]:
    """The watches of one namespace (None: the cluster) for each served kind, into `ctx.workloads`."""
    cache = ctx.workloads
    assert cache is not None
    out = []
    for row in kinds:
        holder: list[ListWatch] = []
        watch = ListWatch(
            kube, namespace, "",
            functools.partial(workload_event, ctx, row.key),
            functools.partial(workloads_listed, ctx, row.key),
            server_timeout=s.watch_server_timeout,
            client_timeout=s.watch_client_timeout,
            connect_timeout=s.watch_connect_timeout,
            count_restart=functools.partial(_restarted, cache, holder, row.key),
            api_version=row.api_version, kind=row.kind, what=f"{row.kind} watch (trainer workloads)",
        )  # fmt: skip
        holder.append(watch)
        out.append(watch)
    return out


def _restarted(cache: WorkloadCache, holder: list[ListWatch], kind: str, reason: str) -> None:
    """A watch of `kind` restarts for `reason`: after a failure, passes read with a GET until it listed again."""
    if reason in RELIST_AFTER and holder:
        watch = holder[0]
        cache.distrust(kind, watch.namespace)
        watch.version = None  # list again: what the failure hid is then seen
