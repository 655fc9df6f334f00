"""The operator's one way to the Kubernetes API: plain-dict REST calls on one thread pool.

Built once per operator process (`main.run_operator`) and handed to everything that talks to
the API server: the Kubernetes `Platform`, the reconcile steps, the status writer, Events, the
controller API's access reviews and the leader Lease.

Transport: `connection.ApiConnection`, one urllib3 HTTPS pool with the credentials kopf logs in
with (`kubeconfig`).
The operator's traffic is a handful of calls per reconcile pass, far from what a small thread
pool cannot carry. Every call runs on this object's own pool, so a slow API server never blocks
the event loop that also serves probes and the controller API, and every request carries a
timeout. The
pool is not first in first out: a started pass's calls go ahead of later passes' calls, and calls
made outside passes (Lease, access reviews, the controller API's status writes) ahead of all
passes (`api_pool`: as one FIFO the pool livelocks on a large fleet).
Requests are plain dicts sent as JSON (no generated model classes): one code path serves pods,
Services, Deployments, Jobs, Events, Leases, reviews and custom resources (RLJob, RayCluster).

Every failed call raises one error tree (a transport failure has status 0):

    KubeApiError (controller_runtime.errors.PlatformError)   .status .reason .body
     ├── NotFound    404
     ├── Conflict    409  AlreadyExists, a moved resourceVersion, a failed precondition
     └── Invalid     422  the schema refused the object, or an immutable field changed
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import urllib3

from controller_runtime.errors import PlatformError
from rljob_operator.kinds import API_VERSION, KIND, PLURALS
from rljob_operator.kube.api_pool import PriorityPool, WaitObserver, current_rank
from rljob_operator.kube.connection import ApiConnection, connect

COMPONENT = "rljob-operator"  # Events' source and reporting component
FIELD_MANAGER = "rljob-operator"  # server-side apply's manager of what the operator owns
USER_AGENT = "rljob-operator"  # followed by /<identity> of the replica (main)
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"


class KubeApiError(PlatformError):
    """A Kubernetes API call failed: the answer's HTTP status (0: no answer) and message."""

    def __init__(self, what: str, status: int, reason: str, body: str = "") -> None:
        detail = _status_message(body) or reason
        super().__init__(f"{what}: HTTP {status}: {detail}")
        self.status = status
        self.reason = reason
        self.body = body


class NotFound(KubeApiError):
    """404: the object (or its namespace) does not exist."""


class Conflict(KubeApiError):
    """409: it exists already, or someone wrote it first (resourceVersion, precondition)."""


class Invalid(KubeApiError):
    """422: the API server refused the object (schema, CEL rule, immutable field)."""


_BY_STATUS: dict[int, type[KubeApiError]] = {404: NotFound, 409: Conflict, 422: Invalid}


def api_error(what: str, status: int, reason: str, body: str = "") -> KubeApiError:
    """The error of the tree that `status` names."""
    return _BY_STATUS.get(status, KubeApiError)(what, status, reason, body)


def _status_message(body: str) -> str:
    try:
        return str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        return body[:500]


def names_object(body: str, name: str) -> bool:
    """Whether a 404's Status names the object `name` (it does not exist) rather than saying the
    resource itself is not served ("the server could not find the requested resource")."""
    try:
        details = json.loads(body).get("details") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(details, dict) and details.get("name") == name


def load_api_client(kubeconfig: str | None = None, connections: int | None = None) -> ApiConnection:
    """The operator's connection (`connection.connect`): an explicit kubeconfig, else in-cluster.

    `connections`: the HTTPS connections kept open, one per thread of the `KubeApi` that uses
    it; a pool of more threads than connections paid a TLS handshake for every call beyond them
    and threw the connection away."""
    return connect(kubeconfig, connections or 1)


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    """REST path of a resource (`/api/v1/...` for the core group, `/apis/<g>/<v>/...` otherwise).

    `namespace=None` names a cluster-scoped resource (TokenReview, SubjectAccessReview).
    """
    plural = PLURALS.get(kind) or kind.lower() + "s"
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace is not None else f"{base}/{plural}"
    return f"{path}/{name}" if name else path


def event_body(involved: Mapping[str, Any], type_: str, reason: str, message: str, now: float, action: str) -> dict[str, Any]:
    """A core/v1 Event about `involved` (name unique per event, message cut to the API's limit)."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}", "namespace": involved["namespace"]},
        "involvedObject": dict(involved),
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "action": action,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
    }


class KubeApi:
    """Plain-dict REST calls on a thread pool, off the event loop."""

    def __init__(
        self,
        api_client: ApiConnection,
        threads: int = 8,
        request_timeout: float = 30.0,
        on_wait: WaitObserver | None = None,
    ) -> None:
        self.api_client = api_client
        self.request_timeout = request_timeout
        self._pool = PriorityPool(threads, "kubeapi", on_wait)

    def queued(self) -> int:
        """Calls waiting for a thread of this client's pool."""
        return self._pool.queued()

    def has_work_waiting(self) -> bool:
        """Whether calls other than resyncs' wait for a thread (`api_pool`)."""
        return self._pool.work_waiting()

    def close(self) -> None:
        self._pool.shutdown()
        self.api_client.close()

    # ---------------------------------------------------------------- the one request path
    def _request(
        self, method: str, path: str, query: Sequence[tuple[str, str]], body: Any, content_type: str | None
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        resp = self.api_client.request(method, path, query, body, headers, self.request_timeout)
        if not 200 <= resp.status <= 299:
            raise api_error(f"{method} {path}", resp.status, resp.reason, resp.data.decode(errors="replace"))
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
        """The response object; None when the status is one of `ok` (e.g. 404 for a delete).

        Queued by the rank of the pass making it (`api_pool`); cancelling the caller (a pass that
        timed out) withdraws a call no thread has taken yet."""
        request = functools.partial(self._request, method, path, query, body, content_type)
        try:
            return await asyncio.wrap_future(self._pool.submit(request, current_rank()))
        except KubeApiError as e:
            if e.status in ok:
                return None
            raise
        except (OSError, urllib3.exceptions.HTTPError) as e:
            raise api_error(f"{method} {path}", getattr(e, "status", 0) or 0, str(e)) from e

    async def _object(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """A call that must answer an object (no `ok` statuses)."""
        result = await self.call(method, path, **kwargs)
        assert result is not None
        return result

    async def apply(
        self, obj: Mapping[str, Any], *, field_manager: str = FIELD_MANAGER, force: bool = True
    ) -> dict[str, Any]:
        """Server-side apply `obj` (create or update); returns the object as stored.

        `force=True` takes over fields another manager set (a `kubectl edit` of an owned
        Service is reverted on the next reconcile): the operator is the owner of what it
        applies, as controller-runtime's ForceOwnership recommends. Immutable fields (a Job's
        pod template) still fail: `Invalid` (422), delete and recreate then.
        """
        meta = obj.get("metadata") or {}
        name, namespace = meta.get("name"), meta.get("namespace")
        if not name or not namespace:
            raise ValueError("apply needs metadata.name and metadata.namespace")
        path = resource_path(obj["apiVersion"], obj["kind"], namespace, name)
        query = [("fieldManager", field_manager)] + ([("force", "true")] if force else [])
        return await self._object("PATCH", path, query=query, body=dict(obj), content_type=APPLY_PATCH)

    async def get_stored(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored object of `obj`'s apiVersion, kind, namespace and name; None when absent.

        What the children resync reads to tell drift from an object that is as applied. Read with
        `resourceVersion=0`: the API server answers from its watch cache instead of a quorum read
        of etcd, as an informer's cache would, which is what the resync needs (a copy a few
        milliseconds old is repaired at the next resync at worst, and a false "missing" costs one
        idempotent apply). At steady state these reads are the bulk of the operator's traffic."""
        meta = obj.get("metadata") or {}
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return await self.call("GET", path, query=[("resourceVersion", "0")], ok=(404,))

    async def create_if_absent(self, obj: Mapping[str, Any]) -> bool:
        """Create `obj` unless it exists (409 is success); True when this call created it.

        For objects that must never be re-applied once made, such as a Secret holding a
        generated token (a new value would lock out whoever holds the old one).
        """
        meta = obj.get("metadata") or {}
        path = resource_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        return await self.call("POST", path, body=dict(obj), ok=(409,)) is not None

    # ---------------------------------------------------------------- RLJob
    def _rljob_path(self, namespace: str, name: str) -> str:
        return resource_path(API_VERSION, KIND, namespace, name)

    async def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.call("GET", self._rljob_path(namespace, name), ok=(404,))

    async def list_rljobs(self, namespace: str | None) -> list[dict[str, Any]]:
        """Every RLJob of `namespace` (None: of the cluster), as one consistent LIST."""
        listed = await self._object("GET", resource_path(API_VERSION, KIND, namespace))
        return list(listed.get("items") or [])

    async def annotate_rljob(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge `annotations` into the RLJob's metadata (gone is success)."""
        body = {"metadata": {"annotations": annotations}}
        await self.call("PATCH", self._rljob_path(namespace, name), body=body, content_type=MERGE_PATCH, ok=(404,))

    async def patch_rljob_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the status subresource: lists are replaced, None deletes a key."""
        path = self._rljob_path(namespace, name) + "/status"
        return await self._object("PATCH", path, body={"status": status}, content_type=MERGE_PATCH)

    async def delete_rljob(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Delete the RLJob (children follow by garbage collection); gone or replaced is success."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        await self.call("DELETE", self._rljob_path(namespace, name), body=body, ok=(404, 409))

    # ---------------------------------------------------------------- events
    async def create_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str, now: float, action: str = "Reconcile"
    ) -> None:
        body = event_body(involved, type_, reason, message, now, action)
        await self.call("POST", resource_path("v1", "Event", involved["namespace"]), body=body)

    # ---------------------------------------------------------------- reviews
    async def token_review(self, token: str) -> dict[str, Any]:
        api_version = "authentication.k8s.io/v1"
        body = {"apiVersion": api_version, "kind": "TokenReview", "spec": {"token": token}}
        out = await self._object("POST", resource_path(api_version, "TokenReview", None), body=body)
        return out.get("status", {})

    async def subject_access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        api_version = "authorization.k8s.io/v1"
        body = {"apiVersion": api_version, "kind": "SubjectAccessReview", "spec": spec}
        out = await self._object("POST", resource_path(api_version, "SubjectAccessReview", None), body=body)
        return out.get("status", {})

    # ---------------------------------------------------------------- pods, batch/v1 Job (trainer)
    async def count_pods(self, namespace: str, selector: str) -> int:
        """Pods matching the selector, terminating ones included (they still hold their GPUs)."""
        out = await self._object("GET", resource_path("v1", "Pod", namespace), query=[("labelSelector", selector)])
        return len(out.get("items") or [])

    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and (in the background) its pods; 404 is success."""
        body = {"propagationPolicy": "Background"}
        await self.call("DELETE", resource_path("batch/v1", "Job", namespace, name), body=body, ok=(404,))

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.call("GET", resource_path("batch/v1", "Job", namespace, name), ok=(404,))

    async def get_workload(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A workload of another controller (`spec.trainer.workloadRef`), or None when it does not exist.

        Raises `NotFound` only when the API server does not serve the kind at all (its CRD is not
        installed): a missing object and a missing kind need different fixes."""
        try:
            return await self.call("GET", resource_path(api_version, kind, namespace, name))
        except NotFound as e:
            if names_object(e.body, name):
                return None
            raise

    # ---------------------------------------------------------------- any object (Kueue's Workload, flavors)
    async def get_object(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist (`namespace=None`: cluster-scoped)."""
        return await self.call("GET", resource_path(api_version, kind, namespace, name), ok=(404,))

    async def create_object(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create `obj`; None when one of that name exists already (409)."""
        meta = obj.get("metadata") or {}
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        return await self.call("POST", path, body=dict(obj), ok=(409,))

    async def delete_object(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete it in the background; gone already is success."""
        body = {"propagationPolicy": "Background"}
        await self.call("DELETE", resource_path(api_version, kind, namespace, name), body=body, ok=(404,))

    async def patch_object_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """JSON merge patch of the status subresource; a `metadata.resourceVersion` in the patch
        makes it conditional (409 when someone wrote in between)."""
        path = resource_path(api_version, kind, namespace, name) + "/status"
        return await self._object("PATCH", path, body=patch, content_type=MERGE_PATCH)

    # ---------------------------------------------------------------- coordination.k8s.io/v1 Lease
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.call("GET", resource_path("coordination.k8s.io/v1", "Lease", namespace, name), ok=(404,))

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._object("POST", resource_path("coordination.k8s.io/v1", "Lease", namespace), body=body)

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        path = resource_path("coordination.k8s.io/v1", "Lease", namespace, name)
        return await self._object("PUT", path, body=body)
