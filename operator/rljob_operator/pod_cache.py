"""Every engine pod the operator's watch has seen, by job: one watch for all jobs' passes.

A LIST of a job's engine pods per pass would be a quorum read of the API server per pass per job
and most of a pass's CPU (decoding the pods). The operator already watches engine pods
(`list_watch`, `handlers.engine_pod_event`) to wake a job when its pods move; this keeps what
that watch delivers, so a job's pass reads its pods from memory.

A watch can lag: an event still on its way leaves this view older than the API server's.
What the view may be trusted with is the platform's decision (`platform.KubernetesPlatform`,
which keeps its own expectations), never this module's: here is only the newest copy of each
pod, by resourceVersion, so an event that arrives late can never replace a newer one.

Kept per pod: what the platform reads (`platform.pod_observation`, `platform._cell_of`) and
nothing else: names, labels, the cell-name annotations, deletion mark, node, and of the status
its phase, IP, reason and message, the Ready and PodScheduled conditions and each container's
restart count and waiting/terminated reason. The cache holds every engine pod of the watched
namespaces: the pod spec is ten times the rest, and a kubelet's full status (five conditions,
container images, IDs, mounts, IPs) is most of what is left after the spec, so whole pods would
be much of an RLJob's memory. Dict keys and label strings are interned: each watch event is
decoded afresh, so without it every cached pod would hold its own copy of every key.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from rljob_operator import labels as L
from rljob_operator.interned import interned

_KEPT_METADATA = ("name", "namespace", "deletionTimestamp", "resourceVersion", "uid")
_KEPT_ANNOTATIONS = (L.CELL_NAME_ANNOTATION, L.JOB_NAME_ANNOTATION)
_KEPT_STATUS = ("phase", "podIP", "reason", "message")
_KEPT_CONDITIONS = ("Ready", "PodScheduled")
_KEPT_CONDITION_FIELDS = ("type", "status", "reason", "message")
_KEPT_CONTAINER_STATES = ("waiting", "terminated")


def object_version(obj: Mapping[str, Any]) -> int:
    """An object's resourceVersion as a number (etcd's revision); -1 when it is not one."""
    try:
        return int(str((obj.get("metadata") or {}).get("resourceVersion")))
    except (TypeError, ValueError):
        return -1


pod_version = object_version  # the name the pod watch's readers use


def slim_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a pod status that `platform.pod_observation` reads, in the same shape."""
    out: dict[str, Any] = {k: status[k] for k in _KEPT_STATUS if status.get(k) is not None}
    if "phase" in out:
        out["phase"] = sys.intern(str(out["phase"]))
    conditions = [
        {k: sys.intern(c[k]) if k in ("type", "status") else c[k] for k in _KEPT_CONDITION_FIELDS if c.get(k) is not None}
        for c in status.get("conditions") or []
        if c.get("type") in _KEPT_CONDITIONS
    ]
    if conditions:
        out["conditions"] = conditions
    containers = []
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        kept: dict[str, Any] = {"restartCount": cs.get("restartCount") or 0}
        states = {
            key: {k: st[k] for k in ("reason", "message") if st.get(k)}
            for key in _KEPT_CONTAINER_STATES
            if (st := state.get(key))
        }
        if states:
            kept["state"] = states
        containers.append(kept)
    if containers:
        out["containerStatuses"] = containers
    return out


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a pod the platform reads (`platform.pod_observation`, grouping by cell)."""
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    kept = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    kept["labels"] = interned(meta.get("labels") or {}, max_len=None)  # label values: up to 63 characters
    annotations = meta.get("annotations") or {}
    kept["annotations"] = {k: annotations[k] for k in _KEPT_ANNOTATIONS if k in annotations}
    return {
        "metadata": kept,
        "spec": {"nodeName": sys.intern(str(node))} if node else {},
        "status": slim_status(pod.get("status") or {}),
    }


def job_of(pod: Mapping[str, Any]) -> str:
    """The job label value a pod is filed under: what `labels.engine_selector` selects on."""
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(L.JOB, ""))


class EnginePodCache:
    """The newest watched copy of each engine pod, filed by (namespace, job label value)."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}

    def record(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """Take one watch event (`type`: None for a listed pod, ADDED, MODIFIED, DELETED); an
        event older than the copy held is ignored."""
        meta = pod.get("metadata") or {}
        name, namespace = meta.get("name"), meta.get("namespace")
        if not name or not namespace:
            return
        key = (str(namespace), job_of(pod))
        pods = self._pods.setdefault(key, {})
        held = pods.get(name)
        if held is not None and pod_version(held) > pod_version(pod):
            return
        if event_type == "DELETED":
            pods.pop(name, None)
            if not pods:
                del self._pods[key]
            return
        pods[name] = slim_pod(pod)

    def replace(
        self, namespace: str, job_label: str, listed: list[dict[str, Any]], version: int | None
    ) -> None:
        """Take a quorum LIST of one job's pods (at resourceVersion `version`) as the newer view.

        A watch restarted by a re-list delivers no DELETED for pods gone in the gap: without
        this, such a pod would stay here for good. A held pod the LIST lacks is dropped unless
        it is newer than the LIST (a create the watch saw after the LIST was served)."""
        key = (namespace, job_label)
        held = self._pods.get(key, {})
        fresh = {p["metadata"]["name"]: slim_pod(p) for p in listed}
        for name, pod in held.items():
            newer = version is not None and pod_version(pod) > version
            if newer and (name not in fresh or pod_version(pod) > pod_version(fresh[name])):
                fresh[name] = pod
        if fresh:
            self._pods[key] = fresh
        else:
            self._pods.pop(key, None)

    def resync(self, namespace: str | None, listed: list[dict[str, Any]], version: int | None) -> None:
        """After a whole LIST of the watched scope (one namespace; None: every namespace), whose
        pods went through `record` already: a held pod the LIST lacks was deleted while the watch
        was not looking (a re-list after `410 Gone` delivers no DELETED for it), unless it is newer
        than the LIST."""
        present = {(p["metadata"].get("namespace"), p["metadata"].get("name")) for p in listed}
        for key in [k for k in self._pods if namespace is None or k[0] == namespace]:
            pods = self._pods[key]
            for name in [n for n, p in pods.items() if (key[0], n) not in present]:
                if version is None or pod_version(pods[name]) <= version:
                    del pods[name]
            if not pods:
                del self._pods[key]

    def pods(self, namespace: str, job_label: str) -> list[dict[str, Any]]:
        """The job's engine pods as last watched (copies of the lists, shared pod dicts: read only)."""
        return list(self._pods.get((namespace, job_label), {}).values())

    def __len__(self) -> int:
        return sum(len(p) for p in self._pods.values())
