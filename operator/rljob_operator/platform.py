"""The Kubernetes `Platform`: engine cells as pods, plus `apply` for the job's other objects.

Every call goes through the operator's one `KubeApi` (one thread pool, one error tree); see
`kubeapi` for how requests are made and errors named.

Idempotence is by name: pod names are deterministic in (job, cell index, generation, pod
index), so a retried `create_cell` gets 409 AlreadyExists, which counts as success, and a
cell can never be doubled. Deleting something already gone (404) is success too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from controller_runtime.ports import CellObservation, CellRequest, PodObservation
from rljob_operator import labels as L
from rljob_operator.kube.kubeapi import MERGE_PATCH, KubeApi, resource_path
from rljob_operator.kube.versions import list_version
from rljob_operator.manifests.engine import engine_pods
from rljob_operator.manifests.job import JobView
from rljob_operator.names import engine_pod_name
from rljob_operator.pod_cache import EnginePodCache, pod_version

log = logging.getLogger(__name__)

# With a pod cache, a job's pods are still LISTed this often: the quorum read that bounds
# whatever the watch missed (a re-listed watch reports no DELETED for pods gone in its gap).
POD_RELIST_SECONDS = 300.0


class StaleRead(RuntimeError):
    """A LIST answered at an older resourceVersion than one this platform already saw."""


def _ready(pod: Mapping[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def _message(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    if status.get("message") or status.get("reason"):
        return ": ".join(x for x in (status.get("reason"), status.get("message")) if x)
    for cs in status.get("containerStatuses") or []:
        for key in ("waiting", "terminated"):
            st = (cs.get("state") or {}).get(key)
            if st and (st.get("reason") or st.get("message")):
                return ": ".join(x for x in (st.get("reason"), st.get("message")) if x)
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
    return ""


def pod_observation(pod: Mapping[str, Any]) -> PodObservation:
    """One pod as the controller sees it. A pod being deleted counts as Failed ("Terminating")."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    message = _message(pod)
    if meta.get("deletionTimestamp"):
        phase, message = "Failed", "Terminating"
    return PodObservation(
        name=meta.get("name", ""),
        phase=phase,
        ip=status.get("podIP") or None,
        ready=_ready(pod) and not meta.get("deletionTimestamp"),
        restarts=sum(int(cs.get("restartCount") or 0) for cs in status.get("containerStatuses") or []),
        node=(pod.get("spec") or {}).get("nodeName"),
        message=message,
    )


def _int_label(pod: Mapping[str, Any], key: str) -> int:
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {}).get(key, ""))
    except ValueError:
        return -1


def _cell_of(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return (meta.get("annotations") or {}).get(L.CELL_NAME_ANNOTATION) or (meta.get("labels") or {}).get(
        L.CELL, ""
    )


def _url_host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


class KubernetesPlatform:
    """controller_runtime.ports.Platform on Kubernetes: one cell = its engine pods.

    `observe_cells` reads the pods, groups them by cell, and keeps the newest generation of each: older
    generations are leftovers of a recreation and are deleted here (their names are
    kept in `last_leftovers` for the caller to report). A cell whose newest generation
    is entirely terminating is reported as absent (it is going away), a partly
    terminating one with those pods Failed, and a pod missing from a cell as Unknown (`missing`),
    so a cell is never mistaken for healthy with fewer pods than its shape.

    The pods come from the operator's pod watch (`pods`, shared by every job) when it can be
    trusted, else from a quorum LIST. Trusted means what KubeRay's scale expectations mean: the
    watch's view holds every pod this platform knows to exist (seen by its last observation or
    created since), each at least as new as seen, and nothing older than the last LIST.
    A pod the watch lacks (gone, or created and not delivered yet) is asked of the API server,
    so the watch can make a pod look alive for a watch's latency longer, never make a live
    cell look gone: a serving cell is never recreated from an older view (`StaleRead` guards
    the LISTs). A steady job reads its pods from memory: no LIST per pass.
    """

    # The `-engines` Service lists Ready pods only, and a cell's head is Ready once its engine
    # answers `/health` (its readinessProbe): a head created serving joins when it is up.
    admits_when_ready = True

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        job: Mapping[str, Any] | JobView,
        pods: EnginePodCache | None = None,
        *,
        relist_seconds: float = POD_RELIST_SECONDS,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self._source: Mapping[str, Any] = {}
        self.update_job(job)
        self.pods = pods
        self.relist_seconds = relist_seconds
        self._now = now
        self._expected: dict[str, int] | None = None  # pod -> the version last seen (0: created, not seen)
        self._deleted: set[str] = set()  # pods this platform deleted that the watch may still show
        self._job_list_version = 0  # the last LIST of all the job's pods
        self._listed_at = float("-inf")
        self.last_leftovers: tuple[str, ...] = ()
        # Each cell's live head pod (the serving label's only carrier) as the last observe_cells saw
        # it, so that set_serving patches it without a list of its own (an offload relabels every
        # cell at once: one list per cell made it an API round trip more per cell). Creating a
        # cell drops its entry, so a label written before a pass observed the new pods (a window
        # that takes a starting cell out) lists them instead of patching the old ones.
        self._live_heads: dict[str, tuple[str, ...]] = {}
        self._list_version = 0  # the newest pod LIST seen: an older answer is refused

    @property
    def job(self) -> JobView:
        """The job as a cell is built from it: its compact spec, validated here, once per creation."""
        return dataclasses.replace(JobView.of(self._source), namespace=self.namespace)

    def update_job(self, job: Mapping[str, Any] | JobView) -> None:
        """Take a new spec (e.g. after an edit); cells created from now on use it.

        Kept as the spec's non-default fields (a few dicts), not as the validated `RLJobSpec`
        (25 pydantic models, which every job would hold for good), and validated back when a cell
        is created (`job`), which is seldom. The operator hands a spec it validated; a raw one is
        validated here, so that an invalid spec fails now rather than at its first cell."""
        view = JobView.of(job)
        self._source = {
            "metadata": {"name": view.name, "namespace": self.namespace, "uid": view.uid},
            "spec": view.spec.model_dump(by_alias=True, exclude_defaults=True, mode="json"),
        }
        self._name = view.name
        self._pods_per_cell = view.spec.inference.pods_per_cell
        self._port = view.spec.inference.port

    def _pods_path(self, name: str | None = None) -> str:
        return resource_path("v1", "Pod", self.namespace, name)

    async def _list_pods(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """The pods of `selector`, never older than the last list this platform acted on.

        A LIST without a resourceVersion is a consistent read, but one served from a lagging
        cache (an API server replica behind, a proxy) may predate pods we saw: acted on, it
        reads as "the cell's pods are gone" and a live cell would be recreated beside itself.
        Such an answer raises `StaleRead` (the pass fails and is retried) instead.
        """
        result = await self.kube.call(
            "GET", self._pods_path(), [("labelSelector", L.selector_string(selector))]
        )
        version = list_version(result)
        if version is not None:
            if version < self._list_version:
                raise StaleRead(
                    f"pod list at resourceVersion {version}, older than {self._list_version} already seen"
                )
            self._list_version = version
        return list((result or {}).get("items") or [])

    def _from_watch(self) -> list[dict[str, Any]] | None:
        """The job's pods as the watch holds them, when that view may be acted on; else None."""
        if self.pods is None or self._expected is None or self._now() - self._listed_at >= self.relist_seconds:
            return None
        held = {p["metadata"]["name"]: p for p in self.pods.pods(self.namespace, L.label_value(self._name))}
        for name, version in self._expected.items():
            pod = held.get(name)
            if pod is None or pod_version(pod) < version:
                return None
        self._deleted &= held.keys()
        return [
            p for name, p in held.items()
            if name not in self._deleted and (name in self._expected or pod_version(p) > self._job_list_version)
        ]  # fmt: skip

    async def _job_pods(self) -> list[dict[str, Any]]:
        """All the job's engine pods: from the watch when it may be trusted, else a quorum LIST."""
        watched = self._from_watch()
        if watched is not None:
            return watched
        pods = await self._list_pods(L.engine_selector(self._name))
        self._listed_at = self._now()
        self._job_list_version = self._list_version
        self._deleted &= {p["metadata"]["name"] for p in pods}
        if self.pods is not None:
            self.pods.replace(self.namespace, L.label_value(self._name), pods, self._list_version)
        return pods

    def _gone(self, names: list[str]) -> None:
        """Pods this platform deleted: expected no more, hidden from the watch's view until it drops them."""
        for n in names:
            if self._expected is not None:
                self._expected.pop(n, None)
            self._deleted.add(n)

    async def create_cell(self, request: CellRequest) -> None:
        async def create(pod: dict[str, Any]) -> None:
            await self.kube.call("POST", self._pods_path(), body=pod, ok=(409,))

        self._live_heads.pop(request.name, None)  # new pods: set_serving lists them until observed
        pods = engine_pods(self.job, request)
        if self._expected is not None:
            for p in pods:
                self._expected.setdefault(p["metadata"]["name"], 0)
                self._deleted.discard(p["metadata"]["name"])
        await asyncio.gather(*(create(p) for p in pods))

    async def _delete_pod(self, name: str) -> None:
        await self.kube.call("DELETE", self._pods_path(name), ok=(404,))

    async def delete_cell(self, name: str) -> None:
        self._live_heads.pop(name, None)
        pods = await self._list_pods(L.cell_selector(self._name, name))
        names = [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")]
        self._gone(names)
        await asyncio.gather(*(self._delete_pod(n) for n in names))

    async def observe_cells(self) -> list[CellObservation]:
        pods = await self._job_pods()
        self._expected = {p["metadata"]["name"]: pod_version(p) for p in pods if p["metadata"]["name"] not in self._deleted}
        by_cell: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            cell = _cell_of(pod)
            if not cell or _int_label(pod, L.GENERATION) < 0 or _int_label(pod, L.CELL_INDEX) < 0:
                log.warning("ignoring engine pod %s without cell labels", pod["metadata"].get("name"))
                continue
            by_cell.setdefault(cell, []).append(pod)
        cells: list[CellObservation] = []
        leftovers: list[str] = []
        live: dict[str, tuple[str, ...]] = {}
        for name, cell_pods in by_cell.items():
            newest = max(_int_label(p, L.GENERATION) for p in cell_pods)
            current = [p for p in cell_pods if _int_label(p, L.GENERATION) == newest]
            leftovers += [
                p["metadata"]["name"]
                for p in cell_pods
                if _int_label(p, L.GENERATION) != newest and not p["metadata"].get("deletionTimestamp")
            ]
            if all(p["metadata"].get("deletionTimestamp") for p in current):
                continue
            live[name] = tuple(
                p["metadata"]["name"]
                for p in current
                if _int_label(p, L.POD_INDEX) == 0 and not p["metadata"].get("deletionTimestamp")
            )
            cells.append(self._observe_cell(name, newest, current))
        self._live_heads = live
        self.last_leftovers = tuple(sorted(leftovers))
        if leftovers:
            log.info("deleting pods of superseded cell generations: %s", ", ".join(self.last_leftovers))
            self._gone(leftovers)
            await asyncio.gather(*(self._delete_pod(n) for n in leftovers))
        return sorted(cells, key=lambda c: (c.index, c.name))

    def _observe_cell(self, name: str, generation: int, pods: list[dict[str, Any]]) -> CellObservation:
        index = _int_label(pods[0], L.CELL_INDEX)
        by_index = {_int_label(p, L.POD_INDEX): pod_observation(p) for p in pods}
        observed: list[PodObservation] = []
        for i in range(max(self._pods_per_cell, len(by_index))):
            if i in by_index:
                observed.append(by_index[i])
            else:
                missing = engine_pod_name(self._name, index, generation, i)
                observed.append(PodObservation(name=missing, phase="Unknown", message="pod missing", missing=True))
        head = by_index.get(0)
        endpoint = None
        if head is not None and head.ip and head.phase not in ("Failed", "Succeeded"):
            endpoint = f"http://{_url_host(head.ip)}:{self._port}"
        return CellObservation(
            name=name, index=index, generation=generation, pods=tuple(observed), endpoint=endpoint
        )

    async def set_serving(self, name: str, serving: bool) -> None:
        names = self._live_heads.get(name)
        if names is None:  # not observed yet (or gone since): ask the API server
            pods = await self._list_pods(L.cell_head_selector(self._name, name))
            names = tuple(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))
        patch = {"metadata": {"labels": {L.SERVING: "true" if serving else "false"}}}

        async def mark(pod_name: str) -> None:
            await self.kube.call(
                "PATCH", self._pods_path(pod_name), body=patch, content_type=MERGE_PATCH, ok=(404,)
            )

        await asyncio.gather(*(mark(n) for n in names))

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply one of the job's objects (Services, Deployment, Job, RayCluster)."""
        return await self.kube.apply(obj)
