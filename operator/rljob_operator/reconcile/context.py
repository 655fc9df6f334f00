"""The RLJob a reconcile step works on, and the ports it acts through.

Steps take this (and the other objects they change) as arguments and return what they saw;
none of them knows the `JobRuntime` that runs them, so the step modules import nothing of
each other's and the runtime sits on top of them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller_runtime.clock import Clock
from rljob_operator.child_versions import ChildVersions
from rljob_operator.event_recorder import EventRecorder, EventSink
from rljob_operator.kinds import API_VERSION, KIND
from rljob_operator.manifests import PolicyPeers
from rljob_operator.workload_cache import WorkloadCache

# How often a job's children are checked against what was applied (`--children-resync`).
CHILDREN_RESYNC_SECONDS = 30.0


class JobKube(EventSink, Protocol):
    """The Kubernetes calls a job's steps and status writer make (`kubeapi.KubeApi` in production)."""

    def has_work_waiting(self) -> bool: ...

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    async def create_if_absent(self, obj: Mapping[str, Any]) -> bool: ...

    async def get_stored(self, obj: Mapping[str, Any]) -> dict[str, Any] | None: ...

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def delete_job(self, namespace: str, name: str) -> None: ...

    async def count_pods(self, namespace: str, selector: str) -> int: ...

    async def delete_rljob(self, namespace: str, name: str, uid: str | None = None) -> None: ...

    async def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def patch_rljob_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]: ...

    async def get_workload(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def get_object(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None: ...

    async def create_object(self, obj: Mapping[str, Any]) -> dict[str, Any] | None: ...

    async def delete_object(self, api_version: str, kind: str, namespace: str, name: str) -> None: ...

    async def patch_object_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class JobContext:
    namespace: str
    name: str
    uid: str
    kube: JobKube
    recorder: EventRecorder
    clock: Clock
    resync_seconds: float
    children: ChildVersions | None = None  # the children's versions as watched; None: the resync reads each
    children_resync_seconds: float = CHILDREN_RESYNC_SECONDS
    peers: PolicyPeers = field(default_factory=PolicyPeers)  # who the job's NetworkPolicies admit besides its pods
    workloads: WorkloadCache | None = None  # referenced trainer workloads as watched; None: each pass reads

    @property
    def key(self) -> str:
        """`namespace/name`, as logs name the job."""
        return f"{self.namespace}/{self.name}"


def involved_object(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The RLJob as an Event's `involvedObject`."""
    return {"apiVersion": API_VERSION, "kind": KIND, "name": name, "namespace": namespace, "uid": uid}
