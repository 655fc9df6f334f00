"""The Kubernetes `Platform`: engine cells as pods, plus `apply` for the job's other objects.

Client library: the official synchronous `kubernetes` client, each call run in
`asyncio.to_thread`. It is already a dependency (the operator's other API calls, the test
cluster's agent and fixtures use it), it handles kubeconfig and in-cluster auth, and the
platform's traffic is a handful of calls per reconcile pass, far from what a thread pool
cannot carry; `kubernetes_asyncio` would add a second client with its own config loading
for no measurable gain. Requests go through the client's generic `param_serialize` /
`call_api` with plain dict bodies (no generated model classes), so one code path serves
pods, Services, Deployments, Jobs and custom resources (RayCluster) alike.

Idempotence is by name: pod names are deterministic in (job, cell index, generation, pod
index), so a retried `create_cell` gets 409 AlreadyExists, which counts as success, and a
cell can never be doubled. Deleting something already gone (404) is success too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException

from controller_runtime.errors import ControllerError
from controller_runtime.ports import CellObservation, CellRequest, PodObservation
from rljob_operator import labels as L
from rljob_operator.manifests.engine import engine_pods
from rljob_operator.manifests.job import JobView
from rljob_operator.names import engine_pod_name

log = logging.getLogger(__name__)

FIELD_MANAGER = "rljob-operator"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"

# kind -> resource (plural). Everything the operator writes; others fall back to kind+"s".
PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "Deployment": "deployments",
    "Job": "jobs",
    "RayCluster": "rayclusters",
    "RLJob": "rljobs",
}


class PlatformError(ControllerError):
    """A Kubernetes API call failed with something other than the idempotent 404/409."""

    def __init__(self, what: str, status: int, reason: str, body: str = "") -> None:
        detail = _status_message(body) or reason
        super().__init__(f"{what}: HTTP {status}: {detail}")
        self.status = status
        self.reason = reason
        self.body = body


def _status_message(body: str) -> str:
    try:
        return str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        return body[:500]


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """REST path of a namespaced resource (`/api/v1/...` for the core group, `/apis/<g>/<v>/...` otherwise)."""
    plural = PLURALS.get(kind) or kind.lower() + "s"
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


class KubeRequests:
    """Plain-dict REST calls through the official client, off the event loop."""

    def __init__(self, api: ApiClient, request_timeout: float = 30.0) -> None:
        self.api = api
        self.request_timeout = request_timeout

    def _call(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        m, url, hdrs, data, post = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(
            m, url, header_params=hdrs, body=data, post_params=post, _request_timeout=self.request_timeout
        )
        resp.read()
        if not 200 <= resp.status <= 299:
            data = resp.data or b""
            text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
            raise PlatformError(f"{method} {path}", resp.status, resp.reason or "", text)
        return json.loads(resp.data or b"{}")

    async def call(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
        *,
        ok: tuple[int, ...] = (),
    ) -> dict[str, Any] | None:
        """The response object; None when the status is one of `ok` (e.g. 404 for a delete)."""
        try:
            return await asyncio.to_thread(self._call, method, path, query, body, content_type)
        except PlatformError as e:
            if e.status in ok:
                return None
            raise
        except (ApiException, OSError, urllib3.exceptions.HTTPError) as e:
            raise PlatformError(f"{method} {path}", getattr(e, "status", 0) or 0, str(e)) from e


async def apply(
    api: ApiClient | KubeRequests,
    obj: Mapping[str, Any],
    *,
    field_manager: str = FIELD_MANAGER,
    force: bool = True,
) -> dict[str, Any]:
    """Server-side apply `obj` (create or update); returns the object as stored.

    `force=True` takes over fields another manager set (a `kubectl edit` of an owned
    Service is reverted on the next reconcile): the operator is the owner of what it
    applies, as controller-runtime's ForceOwnership recommends. Immutable fields (a Job's
    pod template) still fail with 422 (PlatformError.status): delete and recreate then.
    """
    req = api if isinstance(api, KubeRequests) else KubeRequests(api)
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not name or not namespace:
        raise ValueError("apply needs metadata.name and metadata.namespace")
    path = resource_path(obj["apiVersion"], obj["kind"], namespace, name)
    query = [("fieldManager", field_manager)] + ([("force", "true")] if force else [])
    result = await req.call("PATCH", path, query, dict(obj), APPLY_CONTENT_TYPE)
    assert result is not None
    return result


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

    `observe_cells` reads the pods straight from the API server (a quorum list, not a
    cache), groups them by cell, and keeps the newest generation of each: older
    generations are leftovers of a recreation and are deleted here (their names are
    kept in `last_leftovers` for the caller to report). A cell whose newest generation
    is entirely terminating is reported as absent (it is going away), a partly
    terminating one with those pods Failed, and a pod missing from a cell as Unknown,
    so a cell is never mistaken for healthy with fewer pods than its shape.
    """

    def __init__(
        self,
        api: ApiClient | KubeRequests,
        namespace: str,
        job: Mapping[str, Any] | JobView,
        *,
        request_timeout: float = 30.0,
    ) -> None:
        self.requests = api if isinstance(api, KubeRequests) else KubeRequests(api, request_timeout)
        self.namespace = namespace
        self._job = dataclasses.replace(JobView.of(job), namespace=namespace)
        self.last_leftovers: tuple[str, ...] = ()

    @property
    def job(self) -> JobView:
        return self._job

    def update_job(self, job: Mapping[str, Any] | JobView) -> None:
        """Take a new spec (e.g. after an edit); cells created from now on use it."""
        self._job = dataclasses.replace(JobView.of(job), namespace=self.namespace)

    def _pods_path(self, name: str | None = None) -> str:
        return resource_path("v1", "Pod", self.namespace, name)

    async def _list_pods(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        result = await self.requests.call(
            "GET", self._pods_path(), [("labelSelector", L.selector_string(selector))]
        )
        return list((result or {}).get("items") or [])

    async def create_cell(self, request: CellRequest) -> None:
        async def create(pod: dict[str, Any]) -> None:
            await self.requests.call("POST", self._pods_path(), body=pod, ok=(409,))

        await asyncio.gather(*(create(p) for p in engine_pods(self._job, request)))

    async def _delete_pod(self, name: str) -> None:
        await self.requests.call("DELETE", self._pods_path(name), ok=(404,))

    async def delete_cell(self, name: str) -> None:
        pods = await self._list_pods(L.cell_selector(self._job.name, name))
        names = [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")]
        await asyncio.gather(*(self._delete_pod(n) for n in names))

    async def observe_cells(self) -> list[CellObservation]:
        pods = await self._list_pods(L.engine_selector(self._job.name))
        by_cell: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            cell = _cell_of(pod)
            if not cell or _int_label(pod, L.GENERATION) < 0 or _int_label(pod, L.CELL_INDEX) < 0:
                log.warning("ignoring engine pod %s without cell labels", pod["metadata"].get("name"))
                continue
            by_cell.setdefault(cell, []).append(pod)
        cells: list[CellObservation] = []
        leftovers: list[str] = []
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
            cells.append(self._observe_cell(name, newest, current))
        self.last_leftovers = tuple(sorted(leftovers))
        if leftovers:
            log.info("deleting pods of superseded cell generations: %s", ", ".join(self.last_leftovers))
            await asyncio.gather(*(self._delete_pod(n) for n in leftovers))
        return sorted(cells, key=lambda c: (c.index, c.name))

    def _observe_cell(self, name: str, generation: int, pods: list[dict[str, Any]]) -> CellObservation:
        index = _int_label(pods[0], L.CELL_INDEX)
        by_index = {_int_label(p, L.POD_INDEX): pod_observation(p) for p in pods}
        observed: list[PodObservation] = []
        for i in range(max(self._job.spec.inference.pods_per_cell, len(by_index))):
            if i in by_index:
                observed.append(by_index[i])
            else:
                missing = engine_pod_name(self._job.name, index, generation, i)
                observed.append(PodObservation(name=missing, phase="Unknown", message="pod missing"))
        head = by_index.get(0)
        endpoint = None
        if head is not None and head.ip and head.phase not in ("Failed", "Succeeded"):
            endpoint = f"http://{_url_host(head.ip)}:{self._job.spec.inference.port}"
        return CellObservation(
            name=name, index=index, generation=generation, pods=tuple(observed), endpoint=endpoint
        )

    async def set_serving(self, name: str, serving: bool) -> None:
        pods = await self._list_pods(L.cell_selector(self._job.name, name))
        patch = {"metadata": {"labels": {L.SERVING: "true" if serving else "false"}}}

        async def mark(pod_name: str) -> None:
            await self.requests.call(
                "PATCH", self._pods_path(pod_name), body=patch, content_type=MERGE_PATCH, ok=(404,)
            )

        await asyncio.gather(
            *(mark(p["metadata"]["name"]) for p in pods if not p["metadata"].get("deletionTimestamp"))
        )

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply one of the job's objects (Services, Deployment, Job, RayCluster)."""
        return await apply(self.requests, obj)
