"""The operator's own Kubernetes calls (status, events, reviews, the Lease), async.

The official client is synchronous; every call runs on a small dedicated thread pool so a
slow API server never blocks the event loop that also serves probes and the controller API.
Bodies go out and come back as plain dicts (`_preload_content=False`): our objects are
described by our pydantic models, not by the client's generated classes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from rljob_operator.leader import LeaseConflict, LeaseRecord

GROUP = "rljob.io"
VERSION = "v1alpha1"
PLURAL = "rljobs"
KIND = "RLJob"
COMPONENT = "rljob-operator"

T = TypeVar("T")


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster config inside a pod, else the kubeconfig (explicit path or $KUBECONFIG)."""
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    return client.ApiClient(cfg)


def micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    text = text.replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def is_status(e: BaseException, *codes: int) -> bool:
    return isinstance(e, ApiException) and e.status in codes


class KubeApi:
    def __init__(self, api_client: client.ApiClient, threads: int = 8) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.authn = client.AuthenticationV1Api(api_client)
        self.authz = client.AuthorizationV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kubeapi")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def raw(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        resp = await self.call(fn, *args, _preload_content=False, **kwargs)
        return json.loads(resp.data or b"{}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- RLJob
    async def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.raw(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def patch_rljob_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the status subresource: lists are replaced, None deletes a key."""
        return await self.raw(
            self.custom.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, PLURAL, name, {"status": status},
        )

    async def delete_rljob(self, namespace: str, name: str, uid: str | None = None) -> None:
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name, body=body)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    # ---------------------------------------------------------------- events
    async def create_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str, now: float, action: str = "Reconcile"
    ) -> None:
        ns = involved["namespace"]
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": involved,
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
        await self.call(self.core.create_namespaced_event, ns, body)

    # ---------------------------------------------------------------- reviews
    async def token_review(self, token: str) -> dict[str, Any]:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        out = await self.raw(self.authn.create_token_review, body)
        return out.get("status", {})

    async def subject_access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        out = await self.raw(self.authz.create_subject_access_review, body)
        return out.get("status", {})

    async def count_pods(self, namespace: str, selector: str) -> int:
        """Pods matching the selector, terminating ones included (they still hold their GPUs)."""
        out = await self.raw(self.core.list_namespaced_pod, namespace, label_selector=selector)
        return len(out.get("items") or [])

    # ---------------------------------------------------------------- batch/v1 Job (trainer)
    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and (in the background) its pods; 404 is success."""
        try:
            await self.raw(self.batch.delete_namespaced_job, name, namespace, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.raw(self.batch.read_namespaced_job, name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise


class KubeLeaseStore:
    """`LeaseStore` on a coordination.k8s.io/v1 Lease; optimistic concurrency via resourceVersion."""

    def __init__(self, kube: KubeApi, namespace: str, name: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name

    @staticmethod
    def _record(obj: dict[str, Any]) -> LeaseRecord:
        spec = obj.get("spec") or {}
        return LeaseRecord(
            holder=spec.get("holderIdentity") or None,
            duration_seconds=float(spec.get("leaseDurationSeconds") or 0),
            acquire_time=parse_time(spec.get("acquireTime")),
            renew_time=parse_time(spec.get("renewTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def _body(self, record: LeaseRecord, resource_version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        spec: dict[str, Any] = {
            "holderIdentity": record.holder or "",
            "leaseDurationSeconds": max(1, round(record.duration_seconds)),
            "leaseTransitions": record.transitions,
        }
        if record.acquire_time is not None:
            spec["acquireTime"] = micro_time(record.acquire_time)
        if record.renew_time is not None:
            spec["renewTime"] = micro_time(record.renew_time)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def get(self) -> tuple[LeaseRecord, str] | None:
        try:
            obj = await self.kube.raw(self.kube.coordination.read_namespaced_lease, self.name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return self._record(obj), obj["metadata"]["resourceVersion"]

    async def create(self, record: LeaseRecord) -> str:
        try:
            obj = await self.kube.raw(self.kube.coordination.create_namespaced_lease, self.namespace, self._body(record, None))
        except ApiException as e:
            if e.status == 409:
                raise LeaseConflict(str(e.reason)) from e
            raise
        return obj["metadata"]["resourceVersion"]

    async def update(self, record: LeaseRecord, resource_version: str) -> str:
        try:
            obj = await self.kube.raw(
                self.kube.coordination.replace_namespaced_lease, self.name, self.namespace, self._body(record, resource_version)
            )
        except ApiException as e:
            if e.status == 409:
                raise LeaseConflict(str(e.reason)) from e
            raise
        return obj["metadata"]["resourceVersion"]
