"""The chart grants the operator exactly what its code calls, in both scopes, and the trainer's
`<release>-control` role exactly what the controller API checks.

How the calls are found (statically, no cluster): every request of the operator's own code
goes through `KubeApi._request`, so a recording stand-in for the API connection under a real
`KubeApi` sees them all. Every public coroutine of `KubeApi` and of `KubernetesPlatform` is
called (arguments from a table by parameter name: a new method with a new parameter fails here
until it gets a sample), `apply`/`create_if_absent` with every object the operator builds for
the shipped and golden jobs. kopf's own calls are not ours to record: they are the table
`KOPF_CALLS`, read from kopf's observation, watching and posting code (it lists and watches the
resource it serves, CRDs and namespaces; patches finalizers and progress annotations; posts
core/v1 Events). The chart is rendered by the real helm binary.

Fault: a permission the code needs that the chart lacks (the operator stalls on 403), or one
it grants that no code uses (least privilege). Expectation: neither, in either scope; cluster
scope is the only one with namespaced rules in a ClusterRole; the Lease rule is a Role in the
release namespace.
"""

from __future__ import annotations

import inspect
import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from rljob_operator import auth, kinds
from rljob_operator.child_versions import WATCHED_KINDS
from rljob_operator.kinds import PLURALS
from rljob_operator.kube.connection import Response
from rljob_operator.kube.kubeapi import APPLY_PATCH, KubeApi
from rljob_operator.manifests import engine_pods, ray_auth_secret
from rljob_operator.platform import KubernetesPlatform
from rljob_operator.reconcile.children import desired_children

from controller_runtime.api.workloads import TRAINER_WORKLOADS
from controller_runtime.ports import CellRequest
from tests.integration.test_helm_chart import CHART, _helm
from tests.unit.test_manifests_golden import CASES, CONTROLLER_URL, load_job

Triple = tuple[str, str, str]  # (API group, resource[/subresource], verb)

KOPF_CALLS: set[Triple] = {
    ("rljob.io", "rljobs", "list"),  # the watcher's initial listing
    ("rljob.io", "rljobs", "watch"),
    ("rljob.io", "rljobs", "patch"),  # finalizer, progress and last-handled annotations
    ("", "events", "create"),  # kopf's own warnings (posting)
    ("", "pods", "list"),  # the engine pods' watch (pod_watch)
    ("", "pods", "watch"),
    ("", "namespaces", "list"),  # namespace observer (even for exact names)
    ("", "namespaces", "watch"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),  # resource observer
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}
# The operator's own watches of its children's versions (`main.children_watches`): a LIST, then a
# WATCH of each kind in `child_versions.WATCHED_KINDS`.
CHILDREN_WATCH_CALLS: set[Triple] = {
    (api_version.rpartition("/")[0], PLURALS[kind], verb) for api_version, kind in WATCHED_KINDS for verb in ("list", "watch")
}  # fmt: skip
# The operator's watches of the trainer workloads users reference (`workload_watch`): a LIST, then a
# WATCH of each served kind of `controller_runtime.api.workloads.TRAINER_WORKLOADS`.
WORKLOAD_WATCH_CALLS: set[Triple] = {(w.group, w.plural, verb) for w in TRAINER_WORKLOADS for verb in ("list", "watch")}
CLUSTER_SCOPED = {
    "tokenreviews", "subjectaccessreviews", "customresourcedefinitions", "namespaces",
    "priorityclasses", "workloadpriorityclasses", "resourceflavors",  # Kueue priority and flavors
}  # fmt: skip
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


class RecordingClient:
    """Stands in for `kube.connection.ApiConnection`: records each request, answers 200.

    A pod listing answers one pod of the current and one of an older generation, so that the
    Platform's delete and label paths run too."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.requests: list[tuple[str, str, str | None]] = []

    def request(self, method: str, path: str, query: Any = (), body: Any = None,
                headers: dict[str, str] | None = None, timeout: float | None = None) -> Response:  # fmt: skip
        self.requests.append((method, path, (headers or {}).get("Content-Type")))
        listing = method == "GET" and path.endswith("/pods")
        return Response(200, "OK", json.dumps({"items": self.pods} if listing else {}).encode())

    def close(self) -> None:
        pass


def attributes(method: str, path: str, content_type: str | None) -> set[Triple]:
    """The RBAC (group, resource, verb) of one REST request of ours (never a watch)."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = "/".join([rest[0], *rest[2:3]])
    verb = VERBS.get(method) or ("get" if len(rest) > 1 else "list")
    out = {(group, resource, verb)}
    if method == "PATCH" and content_type == APPLY_PATCH:
        out.add((group, resource, "create"))  # server-side apply creates what is absent
    return out


def built_objects() -> Iterator[dict[str, Any]]:
    for case in CASES:
        job = load_job(case)
        yield from desired_children(job, CONTROLLER_URL)
        yield ray_auth_secret(job, "t")


def sample_pods() -> list[dict[str, Any]]:
    job = load_job("tiny-cpu")
    name = job["metadata"]["name"]
    old = engine_pods(job, CellRequest(name=f"{name}-cell-0", index=0, generation=1))
    new = engine_pods(job, CellRequest(name=f"{name}-cell-0", index=0, generation=2))
    return old + new


SAMPLES: dict[str, Any] = {
    "namespace": "ns", "name": "tiny-cell-0", "uid": "u", "selector": "a=b", "token": "t", "spec": {},
    "status": {}, "body": {}, "type_": "Normal", "reason": "R", "message": "m", "now": 0.0, "serving": True,
    "involved": {"apiVersion": "rljob.io/v1alpha1", "kind": "RLJob", "name": "tiny", "namespace": "ns", "uid": "u"},
    "request": CellRequest(name="tiny-cell-0", index=0, generation=1), "annotations": {"a": "b"},
}  # fmt: skip
GENERIC = {"call", "apply", "create_if_absent", "get_stored"}  # the request primitives: driven through the others
# Calls on any kind (Kueue's objects): driven with the kinds the code passes them, read from
# reconcile/queueing.py's source (`test_the_kueue_call_table_is_what_queueing_calls` keeps it so).
ANY_KIND = {"get_object", "create_object", "delete_object", "patch_object_status"}
KUEUE_CALLS: set[tuple[str, str]] = {
    ("get_object", "WORKLOAD_PRIORITY_CLASS_KIND"),
    ("get_object", "PRIORITY_CLASS_KIND"),
    ("get_object", "RESOURCE_FLAVOR_KIND"),
    ("get_object", "WORKLOAD_KIND"),
    ("create_object", "WORKLOAD_KIND"),  # the Workload built by manifests/workload.py
    ("delete_object", "WORKLOAD_KIND"),
    ("patch_object_status", "WORKLOAD_KIND"),
}


async def drive(obj: Any) -> None:
    for name, fn in inspect.getmembers(obj, inspect.iscoroutinefunction):
        if name.startswith("_") or name in GENERIC | ANY_KIND | WORKLOAD_CALLS:
            continue
        params = inspect.signature(fn).parameters
        missing = [p for p, v in params.items() if p not in SAMPLES and v.default is inspect.Parameter.empty]
        assert not missing, f"{type(obj).__name__}.{name}: add a sample for {missing} to SAMPLES"
        await fn(**{p: SAMPLES[p] for p in params if p in SAMPLES})


# Reads of a trainer workload the user runs (spec.trainer.workloadRef): one per kind of the table.
WORKLOAD_CALLS = {"get_workload"}


async def drive_workload_calls(kube: KubeApi) -> None:
    for w in TRAINER_WORKLOADS:
        await kube.get_workload(w.api_version, w.kind, "ns", "w")


async def drive_kueue_calls(kube: KubeApi) -> None:
    for method, const in sorted(KUEUE_CALLS):
        kind = getattr(kinds, const)
        api_version = kinds.PRIORITY_CLASS_API_VERSION if kind == kinds.PRIORITY_CLASS_KIND else kinds.KUEUE_API_VERSION
        namespace = "ns" if kind == kinds.WORKLOAD_KIND else None
        if method == "create_object":
            await kube.create_object({"apiVersion": api_version, "kind": kind, "metadata": {"name": "w", "namespace": namespace}})
        elif method == "get_object":
            await kube.get_object(api_version, kind, namespace, "w")
        elif method == "delete_object":
            await kube.delete_object(api_version, kind, "ns", "w")
        else:
            await kube.patch_object_status(api_version, kind, "ns", "w", {})


def test_the_kueue_call_table_is_what_queueing_calls() -> None:
    """Every any-kind call in the operator's code, as (method, kind constant), is in KUEUE_CALLS."""
    import ast

    import rljob_operator

    seen: set[tuple[str, str]] = set()
    for path in pathlib.Path(rljob_operator.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ANY_KIND:
                if node.func.attr == "create_object":
                    seen.add((node.func.attr, "WORKLOAD_KIND"))  # its only object: the Workload
                    continue
                const = node.args[1]
                assert isinstance(const, ast.Name), f"{path.name}:{node.lineno}: pass the kind as a kinds.py constant"
                seen.add((node.func.attr, const.id))
    assert seen == KUEUE_CALLS


async def operator_calls() -> set[Triple]:
    client = RecordingClient(sample_pods())
    kube = KubeApi(client)  # type: ignore[arg-type]
    try:
        await drive(kube)
        await drive(KubernetesPlatform(kube, "ns", load_job("tiny-cpu")))
        await drive_kueue_calls(kube)
        await drive_workload_calls(kube)
        for obj in built_objects():
            if obj["kind"] == "Secret":
                await kube.create_if_absent(obj)
            else:
                await kube.apply(obj)
                await kube.get_stored(obj)  # the children resync reads them back
    finally:
        kube.close()
    return {t for request in client.requests for t in attributes(*request)}


def rendered(helm: str, *values: str) -> list[dict[str, Any]]:
    out = _helm(
        helm,
        "template",
        "rljob-operator",
        str(CHART),
        "-n",
        "rljob-system",
        "--kube-version",
        "1.36.3",
        *values,
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def granted(docs: list[dict[str, Any]], subject: dict[str, str]) -> dict[tuple[str, str, str], set[Triple]]:
    """(role kind, role name, namespace) -> what it grants, for every role bound to `subject`."""
    roles = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    out: dict[tuple[str, str, str], set[Triple]] = {}
    for b in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s.get("name") == subject["name"] and s.get("namespace") == subject["namespace"]
                   for s in b["subjects"]):  # fmt: skip
            continue
        ns = b["metadata"].get("namespace", "") if b["roleRef"]["kind"] == "Role" else ""
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"], ns)]
        out[(role["kind"], role["metadata"]["name"], ns)] = {
            (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
        }  # fmt: skip
    return out


@pytest.fixture(scope="module")
async def needed() -> set[Triple]:
    return await operator_calls() | KOPF_CALLS | CHILDREN_WATCH_CALLS | WORKLOAD_WATCH_CALLS


def test_every_kind_the_operator_writes_has_its_resource_named() -> None:
    # a kind missing from PLURALS falls back to kind+"s": "networkpolicys" is a 404 at run time
    assert {o["kind"] for o in built_objects()} <= set(PLURALS)


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_chart_rbac_is_exactly_what_the_operator_calls(scope: str, needed: set[Triple], helm: str) -> None:
    values = (
        ["--set", "scope=namespace", "--set", "watchNamespaces={team-a,team-b}"]
        if scope == "namespace"
        else []
    )
    roles = granted(rendered(helm, *values), {"name": "rljob-operator", "namespace": "rljob-system"})
    union = set().union(*roles.values())
    assert not needed - union, f"missing from the chart ({scope} scope): {sorted(needed - union)}"
    assert not union - needed, f"granted but never called ({scope} scope): {sorted(union - needed)}"
    namespaced = needed - {t for t in needed if t[1] in CLUSTER_SCOPED}
    for (kind, name, ns), rules in roles.items():
        if kind == "ClusterRole" and scope == "namespace":
            assert {t[1] for t in rules} <= CLUSTER_SCOPED, f"{name} grants namespaced resources cluster-wide"
        if kind == "Role" and ns == "rljob-system" and "leases" in {t[1] for t in rules}:
            assert {t[1] for t in rules} == {"leases"}
    if scope == "namespace":
        for ns in ("team-a", "team-b"):
            per_ns = set().union(*(r for (k, _, n), r in roles.items() if k == "Role" and n == ns))
            assert namespaced - {t for t in namespaced if t[1] == "leases"} <= per_ns, f"{ns} lacks a rule"


def test_control_role_grants_exactly_what_the_controller_api_checks(helm: str) -> None:
    docs = rendered(helm)
    role = next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "rljob-operator-control"
    )
    rules = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert rules == {(auth.GROUP, f"{auth.RESOURCE}/{auth.SUBRESOURCE}", auth.VERB)}
