"""What the children resync knows without a read: each child's resourceVersion, from a watch.

The resync (`reconcile.children`) asks every `--children-resync` seconds whether each child of
a job still holds what was applied. Answered by a GET per child, that would be the bulk of the
operator's steady traffic, where KubeRay's operator reads its children from informer caches and
asks the API server nothing.

A stored object changes only with a new resourceVersion, so one watch per child kind (label
`app.kubernetes.io/managed-by=rljob-operator`, `main.children_watches`) that keeps only the
version of each object answers the question for the children that did not change: a check may
skip its read when the watch's current version of the child is the very version the operator
last saw holding the desired object (the answer of its apply, or a read that held), for the
same desired object (`fingerprint`), and that was less than `max_age` seconds ago. Anything
else (a version the watch moved on, a child the watch has not seen or saw deleted, a changed
desired object, an old verification) reads as before. A watch that lags delays a repair by its
lag; one that ends or stalls is listed again and the list corrects every version; an event lost
inside a working stream would cost at most `max_age` of unrepaired drift. Never a wrong repair:
a read then tells.

Pure bookkeeping: no I/O; the watch (`list_watch.ListWatch`) feeds `record` and `resync`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str, str]  # (kind, namespace, name)

# The children's kinds whose versions are watched, (apiVersion, kind). Not the RayCluster: its
# CRD is KubeRay's and may be absent (a watch of it would fail and retry for good), and only
# jobs with spec.rollout.rayCluster have one; those are read as before. Not the token Secret:
# it is never read back (the operator may not read Secrets).
WATCHED_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "Service"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
)
# How long a verification stands without a read: bounds what an event lost inside a working watch
# stream could hide (a watch that ends or stalls is listed again, `list_watch`, and its list
# corrects every version). Long, because every expiry is a read per child for nothing on a large
# fleet; a drift repair is not liveness.
MAX_AGE_SECONDS = 1800.0


@dataclass(slots=True)
class _Seen:
    current: str | None = None  # the version the watch holds; None: the watch has not seen it
    verified: str | None = None  # the version last seen holding `desired`
    desired: int = 0  # fingerprint of the desired object it held
    at: float = 0.0  # when it was verified


def fingerprint(obj: Mapping[str, Any]) -> int:
    """The desired object's identity for `unchanged`: equal objects, equal fingerprints."""
    return hash(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str))


def _key(kind: str, obj: Mapping[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    return (kind, namespace, name) if name and namespace else None


def _version(obj: Mapping[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


class ChildVersions:
    """The children's versions as watched, and as last verified by the resync."""

    def __init__(self, kinds: Iterable[str], max_age: float) -> None:
        self.kinds = frozenset(kinds)  # the watched ones: a child of another kind is always read
        self.max_age = max_age
        self._seen: dict[Key, _Seen] = {}

    def __len__(self) -> int:
        return len(self._seen)

    # == the watch's side =======================================================================

    def record(self, kind: str, type_: str | None, obj: Mapping[str, Any]) -> None:
        """One listed object (`type_` None) or watch event of `kind`."""
        key = _key(kind, obj)
        if key is None:
            return
        if type_ == "DELETED":
            self._seen.pop(key, None)  # verified with it: a child made again is read again
            return
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = _Seen()
        seen.current = _version(obj)

    def resync(
        self, kind: str, namespace: str | None, listed: Iterable[Mapping[str, Any]], version: int | None = None
    ) -> None:
        """A complete LIST of `kind` in `namespace` (None: the cluster): what it lacks is gone (a
        watch started again after `410 Gone` reports no DELETED for what went in its gap). The
        list's `version` is not needed: each object carries its own."""
        present = {key for key in (_key(kind, o) for o in listed) if key is not None}
        for key in [k for k in self._seen if k[0] == kind and (namespace is None or k[1] == namespace)]:
            if key not in present:
                del self._seen[key]

    # == the resync's side ======================================================================

    def unchanged(self, obj: Mapping[str, Any], desired: int, now: float) -> bool:
        """Whether the child `obj` names is known to still hold `desired` (its fingerprint)."""
        key = _key(str(obj.get("kind") or ""), obj)
        seen = self._seen.get(key) if key is not None else None
        return (
            seen is not None
            and seen.verified is not None
            and seen.current == seen.verified
            and seen.desired == desired
            and now - seen.at < self.max_age
        )

    def verified(self, obj: Mapping[str, Any], desired: int, stored: Mapping[str, Any] | None, now: float) -> None:
        """`stored` (an apply's answer, or a read that held) holds the desired object `obj`."""
        key = _key(str(obj.get("kind") or ""), obj)
        version = _version(stored)
        if key is None or version is None or key[0] not in self.kinds:
            return  # an unwatched kind's entry would never be dropped
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = _Seen()
        seen.verified, seen.desired, seen.at = version, desired, now
