"""The trainer workloads RLJobs reference (`spec.trainer.workloadRef`), as a watch last saw them.

Every pass of a workloadRef job needs its workload's outcome (`reconcile.workload_ref`). Read by a
GET per pass, that is one request per job per resync at rest, the traffic the children's watch
(`child_versions`) was built to remove. So
one watch per referenced kind the API server serves (`main.workload_watches`, no label selector:
the user's objects carry none of ours) keeps the status conditions of each object here, and a
pass reads the cache wherever that watch has listed its namespace; elsewhere (a kind whose CRD
was installed after the operator started, a watch that failed and has not listed again) the pass
reads with a GET. A change of a followed workload wakes the jobs that reference it
(`record` answers them), so a job ends when its workload does, not at its next resync.

Pure bookkeeping: no I/O; the watches (`list_watch.ListWatch`) feed `record`, `resync` and `distrust`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Ref = tuple[str, str, str]  # (the kind's table key "apiVersion kind", namespace, name)
JobKey = tuple[str, str]  # the RLJob's (namespace, name)


def _trimmed(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the outcome is read from: the status conditions (not the whole object: a namespace's every Job)."""
    return {"status": {"conditions": list((obj.get("status") or {}).get("conditions") or [])}}


class WorkloadCache:
    """Referenced kinds' objects as watched, and which jobs follow which object."""

    def __init__(self) -> None:
        self._objs: dict[Ref, dict[str, Any]] = {}
        self._listed: set[tuple[str, str | None]] = set()  # (kind key, namespace; None: the cluster)
        self._followers: dict[Ref, set[JobKey]] = {}
        self._following: dict[JobKey, Ref] = {}

    def __len__(self) -> int:
        return len(self._objs)

    # == the watches' side =======================================================================

    def record(self, kind: str, type_: str | None, obj: Mapping[str, Any]) -> set[JobKey]:
        """One listed object (`type_` None) or watch event of `kind`; the jobs that follow it."""
        meta = obj.get("metadata") or {}
        name, namespace = meta.get("name"), meta.get("namespace")
        if not name or not namespace:
            return set()
        ref = (kind, str(namespace), str(name))
        if type_ == "DELETED":
            self._objs.pop(ref, None)
        else:
            self._objs[ref] = _trimmed(obj)
        return set(self._followers.get(ref, ()))

    def resync(self, kind: str, namespace: str | None, listed: Iterable[Mapping[str, Any]]) -> set[JobKey]:
        """A complete LIST of `kind` in `namespace` (None: the cluster): the cache is trusted there
        from now on, and what the list lacks is gone; the jobs that followed what went."""
        present = {(str((o.get("metadata") or {}).get("namespace")), str((o.get("metadata") or {}).get("name")))
                   for o in listed}  # fmt: skip
        gone = [r for r in self._objs if r[0] == kind and (namespace is None or r[1] == namespace) and r[1:] not in present]
        woken: set[JobKey] = set()
        for ref in gone:
            del self._objs[ref]
            woken |= self._followers.get(ref, set())
        self._listed.add((kind, namespace))
        return woken

    def distrust(self, kind: str, namespace: str | None) -> None:
        """The watch failed: passes read with a GET until it has listed again."""
        self._listed.discard((kind, namespace))

    # == the passes' side ========================================================================

    def lookup(self, kind: str, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(whether the cache knows, the object or None when it does not exist)."""
        if (kind, namespace) not in self._listed and (kind, None) not in self._listed:
            return False, None
        return True, self._objs.get((kind, namespace, name))

    def follow(self, job: JobKey, ref: Ref) -> None:
        """`job` references `ref` (its last pass said so): wake it when `ref` changes."""
        old = self._following.get(job)
        if old == ref:
            return
        if old is not None:
            self.forget(job)
        self._following[job] = ref
        self._followers.setdefault(ref, set()).add(job)

    def forget(self, job: JobKey) -> None:
        """`job` is gone (or references nothing now)."""
        ref = self._following.pop(job, None)
        if ref is None:
            return
        followers = self._followers.get(ref)
        if followers is not None:
            followers.discard(job)
            if not followers:
                del self._followers[ref]
