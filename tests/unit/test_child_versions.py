"""The children's versions as the operator's watch sees them (`child_versions`): when the
children resync may skip its read of a child, and when it must read."""

from __future__ import annotations

from typing import Any

from rljob_operator.child_versions import MAX_AGE_SECONDS, WATCHED_KINDS, ChildVersions, fingerprint


def service(name: str = "job-engines", version: str | None = None, port: int = 8000) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if version is not None:
        meta["resourceVersion"] = version
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {"ports": [{"port": port}]}}


def store() -> ChildVersions:
    return ChildVersions((kind for _, kind in WATCHED_KINDS), MAX_AGE_SECONDS)


def test_a_child_is_known_unchanged_only_at_the_version_seen_holding_the_same_desired_object() -> None:
    seen, desired = store(), service()
    mark = fingerprint(desired)
    assert not seen.unchanged(desired, mark, now=0.0), "nothing known: read"
    seen.verified(desired, mark, service(version="7"), now=0.0)  # the apply's answer
    assert not seen.unchanged(desired, mark, now=1.0), "the watch has not seen that version yet"
    seen.record("Service", "ADDED", service(version="7"))
    assert seen.unchanged(desired, mark, now=1.0)
    assert not seen.unchanged(service(port=9000), fingerprint(service(port=9000)), now=1.0), "another desired object"
    assert not seen.unchanged(desired, mark, now=MAX_AGE_SECONDS), "verified too long ago: read"
    seen.record("Service", "MODIFIED", service(version="8"))  # someone edited it
    assert not seen.unchanged(desired, mark, now=2.0)
    seen.verified(desired, mark, service(version="8"), now=2.0)  # a read found it still holding
    assert seen.unchanged(desired, mark, now=3.0)


def test_a_deleted_or_unlisted_child_is_read_again_and_forgotten() -> None:
    seen, desired = store(), service()
    mark = fingerprint(desired)
    seen.verified(desired, mark, service(version="3"), now=0.0)
    seen.record("Service", None, service(version="3"))  # listed
    seen.record("Service", "DELETED", service(version="3"))
    assert not seen.unchanged(desired, mark, now=1.0) and len(seen) == 0
    seen.record("Service", None, service(version="4"))
    seen.verified(desired, mark, service(version="4"), now=1.0)
    seen.record("Service", None, service("job-cells", version="5"))
    seen.resync("Service", "other-ns", [])  # another namespace's list drops nothing here
    assert seen.unchanged(desired, mark, now=2.0)
    seen.resync("Service", "ns", [service("job-cells", version="5")])  # a relist after 410 Gone lacks it
    assert not seen.unchanged(desired, mark, now=2.0) and len(seen) == 1


def test_an_unwatched_kind_is_always_read_and_never_kept() -> None:
    seen = store()
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "job-ray", "namespace": "ns"}}
    mark = fingerprint(cluster)
    seen.verified(cluster, mark, {**cluster, "metadata": {**cluster["metadata"], "resourceVersion": "1"}}, now=0.0)
    assert not seen.unchanged(cluster, mark, now=1.0) and len(seen) == 0


def test_the_fingerprint_ignores_key_order_and_tells_values_apart() -> None:
    a = {"kind": "Service", "spec": {"ports": [{"port": 1, "name": "h"}]}}
    b = {"spec": {"ports": [{"name": "h", "port": 1}]}, "kind": "Service"}
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint({"kind": "Service", "spec": {"ports": [{"port": 2, "name": "h"}]}})
