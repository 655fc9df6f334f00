"""How the operator process wires its shared parts: the engine-pod watch into the pod cache, the
RLJob watch into the relist's record of delivered events, the API client's connection pool
sized to its threads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
import yaml
from rljob_operator import handlers, main
from rljob_operator import labels as L
from rljob_operator.child_versions import WATCHED_KINDS, ChildVersions
from rljob_operator.delivered import Delivered
from rljob_operator.kinds import GROUP, PLURAL, VERSION
from rljob_operator.kube import kopf_watch
from rljob_operator.kube.kopf_watch import kopf_watching
from rljob_operator.kube.kubeapi import load_api_client
from rljob_operator.metrics import Metrics
from rljob_operator.pod_cache import EnginePodCache
from rljob_operator.settings import load_settings


class Kube:
    """Only what building a `PodWatch` reads."""


class Memo:
    def __init__(self) -> None:
        self.pods = EnginePodCache()
        self.runtimes: dict[tuple[str, str], Any] = {}
        self.delivered: dict[tuple[str, str], Delivered] = {}


def engine_pod(name: str, rv: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "rl", "resourceVersion": str(rv),
                     "labels": {L.JOB: "j", L.ROLE: L.ROLE_ENGINE}},
        "status": {"phase": "Running"},
    }  # fmt: skip


def test_an_engine_pod_event_fills_the_shared_cache_and_wakes_its_job() -> None:
    memo = Memo()
    woken: list[str] = []

    class Runtime:
        def poke_for_pod(self, body: dict[str, Any]) -> None:
            woken.append(body["metadata"]["name"])

    memo.runtimes[("rl", "j")] = Runtime()
    handlers.engine_pod_event(memo, None, engine_pod("j-cell-0-g0-0", 3))  # type: ignore[arg-type]
    handlers.engine_pod_event(memo, "ADDED", engine_pod("j-cell-1-g0-0", 4))  # type: ignore[arg-type]
    assert sorted(p["metadata"]["name"] for p in memo.pods.pods("rl", "j")) == [
        "j-cell-0-g0-0",
        "j-cell-1-g0-0",
    ]
    handlers.engine_pod_event(memo, "DELETED", engine_pod("j-cell-0-g0-0", 5))  # type: ignore[arg-type]
    assert [p["metadata"]["name"] for p in memo.pods.pods("rl", "j")] == ["j-cell-1-g0-0"]
    assert woken == ["j-cell-0-g0-0", "j-cell-1-g0-0", "j-cell-0-g0-0"]


async def test_every_rljob_event_is_recorded_for_the_relist_before_its_daemon_runs() -> None:
    """The relist tells a slow daemon spawn from a lost event by this record (relist.plan)."""
    memo = Memo()
    job = {"metadata": {"name": "j", "namespace": "rl", "uid": "u1", "resourceVersion": "3"}, "spec": {}}
    await handlers.wake_rljob(type=None, name="j", namespace="rl", body=job, memo=memo)  # no runtime yet
    assert memo.delivered == {("rl", "j"): Delivered(uid="u1", deleting=False)}
    await handlers.wake_rljob(type="DELETED", name="j", namespace="rl", body=job, memo=memo)
    assert memo.delivered == {}


def test_the_api_client_keeps_as_many_connections_as_its_pool_has_threads(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))  # fmt: skip
    client = load_api_client(str(kubeconfig), connections=32)
    assert client._pool.connection_pool_kw["maxsize"] == 32
    assert load_api_client(str(kubeconfig))._pool.connection_pool_kw["maxsize"] != 32


class NoCopy(dict):  # type: ignore[type-arg]
    """A status entry that must never be deep-copied (kopf's diff base used to copy all of status)."""

    def __deepcopy__(self, memo: Any) -> Any:
        raise AssertionError("status was deep-copied")


def test_kopf_diff_base_is_built_without_copying_status_or_managed_fields_and_is_kopfs_essence() -> None:
    import kopf

    storage = handlers.kopf_settings(handlers.OperatorSettings(all_namespaces=True)).persistence.diffbase_storage
    essence_of = kopf.AnnotationsDiffBaseStorage(prefix=handlers.ANNOTATION_PREFIX, key="last-handled-configuration")
    meta = {
        "name": "j", "namespace": "rl", "uid": "u", "resourceVersion": "7", "generation": 2,
        "labels": {"team": "a"},
        "annotations": {"note": "x", "kubectl.kubernetes.io/last-applied-configuration": "{}",
                        f"{handlers.ANNOTATION_PREFIX}/last-handled-configuration": '{"spec": {}}'},
        "managedFields": [{"manager": "m", "fieldsV1": NoCopy(f={})}],
    }  # fmt: skip
    body = {"apiVersion": "rljob.io/v1alpha1", "kind": "RLJob", "metadata": meta,
            "spec": {"inference": {"replicas": 2}, "trainer": {"steps": 3}},
            "status": {"engines": [NoCopy(name="c0")], "phase": "Running"}}  # fmt: skip
    lean = storage.build(body=kopf.Body(body))
    plain = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
             "status": {"phase": "Running"}}  # what kopf's own build may copy
    assert lean == essence_of.build(body=kopf.Body(plain))
    assert lean == {"spec": {"inference": {"replicas": 2}, "trainer": {"steps": 3}},
                    "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}}}  # fmt: skip
    lean["spec"]["inference"]["replicas"] = 5  # a copy: kopf keeps it as the last handled state
    assert body["spec"]["inference"]["replicas"] == 2


def test_kopf_watches_rljobs_only_and_the_engine_pod_watch_asks_for_engine_pods() -> None:
    """kopf opens a watch for every resource one of its handlers selects: pods are watched by
    the operator's own `list_watch` (kopf's per-event machinery was 30 % of the event loop's busy
    time in an N=300 ramp), whose LIST and WATCH carry the engine label selector, so the API
    server sends engine pods only."""
    registry = kopf.get_default_registry()
    pods = kopf.Resource("", "v1", "pods", kind="Pod", singular="pod", shortcuts=frozenset({"po"}), namespaced=True)
    rljobs = kopf.Resource(GROUP, VERSION, PLURAL, kind="RLJob", singular="rljob", namespaced=True)
    kinds = (registry._indexing, registry._watching, registry._spawning, registry._changing, registry._webhooks)
    assert not any(r.has_handlers(resource=pods) for r in kinds)
    assert registry._watching.has_handlers(resource=rljobs) and registry._spawning.has_handlers(resource=rljobs)
    s = load_settings(["--namespace", "rl", "--namespace", "rl2", "--kubeconfig", "/dev/null"])
    watch = main.engine_pod_watch(s, cast(Any, Kube()), cast(Any, Memo()), Metrics(), "rl2")
    assert (watch.namespace, watch.selector, watch.path) == ("rl2", f"{L.ROLE}={L.ROLE_ENGINE}", "/api/v1/namespaces/rl2/pods")


def test_the_children_watches_ask_for_the_operators_objects_of_each_watched_kind_into_one_store() -> None:
    """The children resync skips its read of a child whose version did not move (`child_versions`):
    one LIST+WATCH per kind and namespace, of the objects labelled as the operator's, each event
    filed under its kind (list items carry no kind of their own)."""
    s = load_settings(["--namespace", "rl", "--kubeconfig", "/dev/null"])
    children = ChildVersions((kind for _, kind in WATCHED_KINDS), 300.0)
    watches = main.children_watches(s, cast(Any, Kube()), children, "rl")
    assert [w.path for w in watches] == [
        "/api/v1/namespaces/rl/services",
        "/apis/networking.k8s.io/v1/namespaces/rl/networkpolicies",
        "/apis/apps/v1/namespaces/rl/deployments",
        "/apis/batch/v1/namespaces/rl/jobs",
    ]
    assert {w.selector for w in watches} == {f"{L.MANAGED_BY}={L.MANAGER}"}
    listed = {"metadata": {"name": "j-engines", "namespace": "rl", "resourceVersion": "5"}}
    watches[0].on_event(None, listed)
    desired = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "j-engines", "namespace": "rl"}}
    children.verified(desired, 1, listed, now=0.0)
    assert children.unchanged(desired, 1, now=1.0)
    watches[0].on_listed("rl", [], 6)  # a new LIST without it: gone
    assert not children.unchanged(desired, 1, now=1.0)


async def test_kopf_is_handed_every_rljob_body_without_managed_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf keeps the latest body of each RLJob for as long as its daemon runs; what its watcher
    reads (`infinite_watch`, listed objects and watch events alike) comes without managedFields,
    every other field as the API server sent it, bookmarks as they were. kopf's own
    `continuous_watch` is stood in for here (it needs an API server); the rest is kopf's code, so
    this fails if a kopf release stops looking `continuous_watch` up by name."""

    def rljob(rv: str) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RLJob",
                "metadata": {"name": "j", "namespace": "rl", "resourceVersion": rv, "finalizers": ["f"],
                             "managedFields": [{"manager": "rljob-operator", "subresource": "status",
                                                "fieldsV1": {"f:status": {"f:phase": {}}}}]},
                "spec": {"inference": {"replicas": 2}}, "status": {"phase": "Running"}}  # fmt: skip

    # each event decoded apart, as the stream's lines are: no key object shared between them
    from_server: list[Any] = [json.loads(json.dumps({"type": None, "object": rljob("5")})), kopf_watching.Bookmark.LISTED,
                              json.loads(json.dumps({"type": "MODIFIED", "object": rljob("6")}))]  # fmt: skip

    async def kopfs_own(**_: Any) -> Any:
        for event in from_server:
            yield event

    monkeypatch.setattr(kopf_watching, "continuous_watch", kopfs_own)
    kopf_watch.keep_managed_fields_out_of_kopf()
    kopf_watch.keep_managed_fields_out_of_kopf()  # a second install does not wrap twice
    rljobs = kopf.Resource(GROUP, VERSION, PLURAL, kind="RLJob", singular="rljob", namespaced=True)
    stream = kopf_watching.infinite_watch(settings=kopf.OperatorSettings(), resource=rljobs, namespace="rl", _iterations=1)
    seen = [event async for event in stream]

    expected = [{"type": None, "object": rljob("5")}, kopf_watching.Bookmark.LISTED,
                {"type": "MODIFIED", "object": rljob("6")}]  # fmt: skip
    for event in expected:
        if isinstance(event, dict):
            del event["object"]["metadata"]["managedFields"]
    assert seen == expected
    # and its strings are shared between the bodies kopf keeps (`interned`)
    first, second = seen[0]["object"], seen[2]["object"]
    assert all(k1 is k2 for k1, k2 in zip(first["metadata"], second["metadata"], strict=True))
    assert first["status"]["phase"] is second["status"]["phase"]
