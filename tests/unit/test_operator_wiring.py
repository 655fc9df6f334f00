"""How the operator process wires its shared parts: the engine-pod watch into the pod cache, the
RLJob watch into the relist's record of delivered events, the API client's connection pool
sized to its threads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kopf._cogs.structs.references import Resource
from rljob_operator import handlers
from rljob_operator import labels as L
from rljob_operator.delivered import Delivered
from rljob_operator.kinds import GROUP, PLURAL, VERSION
from rljob_operator.kubeapi import load_api_client
from rljob_operator.pod_cache import EnginePodCache
from rljob_operator.settings import load_settings


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


async def test_the_engine_pod_watch_fills_the_shared_cache_and_deletions_leave_it() -> None:
    memo = Memo()
    await handlers.wake_for_engine_pod(
        type=None, body=engine_pod("j-cell-0-g0-0", 3), namespace="rl", memo=memo
    )
    await handlers.wake_for_engine_pod(
        type="ADDED", body=engine_pod("j-cell-1-g0-0", 4), namespace="rl", memo=memo
    )
    assert sorted(p["metadata"]["name"] for p in memo.pods.pods("rl", "j")) == [
        "j-cell-0-g0-0",
        "j-cell-1-g0-0",
    ]
    await handlers.wake_for_engine_pod(
        type="DELETED", body=engine_pod("j-cell-0-g0-0", 5), namespace="rl", memo=memo
    )
    assert [p["metadata"]["name"] for p in memo.pods.pods("rl", "j")] == ["j-cell-1-g0-0"]


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


def test_the_api_server_sends_the_pod_watch_only_engine_pods_and_the_rljob_watch_everything() -> None:
    """kopf builds its watch and list queries from `collect` (`kopf._cogs.clients.watching`,
    `fetching`); the handler's own `labels=` filter runs on the client, after every pod of the
    namespace (or the cluster) was sent and decoded."""
    ks = handlers.kopf_settings(load_settings(["--namespace", "rl"]))
    pods = Resource("", "v1", "pods", kind="Pod", singular="pod", shortcuts=frozenset({"po"}), namespaced=True)
    rljobs = Resource(GROUP, VERSION, PLURAL, kind="RLJob", singular="rljob", namespaced=True)
    services = Resource("", "v1", "services", kind="Service", singular="service", namespaced=True)
    assert ks.watching.label_selectors.collect(pods) == [f"{L.ROLE}={L.ROLE_ENGINE}"]
    assert ks.watching.label_selectors.collect(rljobs) == []
    assert ks.watching.label_selectors.collect(services) == []
