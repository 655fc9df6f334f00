"""The leader election's `LeaseStore` on a coordination.k8s.io/v1 Lease.

Optimistic concurrency through `resourceVersion`: a write that lost the race is a 409
(`kubeapi.Conflict`), which `leader` knows as `LeaseConflict`. Times travel as the Lease's
MicroTime strings; the election itself judges expiry by the local clock (see `leader`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rljob_operator.kube.kubeapi import Conflict, KubeApi
from rljob_operator.leader import LeaseConflict, LeaseRecord


def micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    text = text.replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


class KubeLeaseStore:
    """`LeaseStore` on the named Lease."""

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
        obj = await self.kube.get_lease(self.namespace, self.name)
        if obj is None:
            return None
        return self._record(obj), obj["metadata"]["resourceVersion"]

    async def create(self, record: LeaseRecord) -> str:
        try:
            obj = await self.kube.create_lease(self.namespace, self._body(record, None))
        except Conflict as e:
            raise LeaseConflict(e.reason) from e
        return str(obj["metadata"]["resourceVersion"])

    async def update(self, record: LeaseRecord, resource_version: str) -> str:
        try:
            obj = await self.kube.replace_lease(self.namespace, self.name, self._body(record, resource_version))
        except Conflict as e:
            raise LeaseConflict(e.reason) from e
        return str(obj["metadata"]["resourceVersion"])
