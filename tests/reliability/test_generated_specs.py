"""Generated RLJob specs: the real API server and local mode take the same decision on each,
and every refusal names the field.

Specs are the shipped examples with one to three fields replaced by values drawn from the
CRD's own schema (hypothesis): values inside and just outside each bound, enum members and
strangers, wrong types, nulls, unknown keys. Each is sent to the kube-apiserver with
`dryRun=All` and strict field validation, and validated by local mode's models
(`RLJobManifest`, what `rljob run` loads). Fault: a spec one side accepts and the other
refuses (the CRD and the models are meant to be one source of truth), or a refusal that does
not say which field. Examples are derandomized and bounded, so CI is repeatable.
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as kclient
from pydantic import ValidationError
from rljob_cli.manifest import describe, field_path

from controller_runtime.api import GROUP, PLURAL, VERSION
from controller_runtime.api.spec import RLJobManifest
from tests.integration.operator_harness import install_crd
from tests.unit.crd_cases import EXAMPLES, REPO_ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

SPEC_SCHEMA = yaml.safe_load((REPO_ROOT / "crds" / "rljob.yaml").read_text())["spec"]["versions"][0][
    "schema"
]["openAPIV3Schema"]["properties"]["spec"]
BASES = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
STRANGERS = st.sampled_from([None, "", "x", -1, 0, 1.5, True, [], {}, {"bogusField": 1}])


def schema_paths(
    node: dict[str, Any], path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every property path under spec (objects too), with its schema node."""
    out = [(path, node)] if path else []
    for key, child in (node.get("properties") or {}).items():
        out += schema_paths(child, (*path, key))
    return out


def embedded_kubernetes_type(path: tuple[str, ...]) -> bool:
    """Under a Kubernetes type the CRD embeds whole (a template's PodSpec, an env var's
    valueFrom): the API server validates it; the models keep it as given, and local mode
    refuses a template's pod spec and reads valueFrom from --env-file."""
    pairs = list(itertools.pairwise(path))
    return ("template", "spec") in pairs or "valueFrom" in path[:-1]


PATHS = [(path, node) for path, node in schema_paths(SPEC_SCHEMA) if not embedded_kubernetes_type(path)]


def near(node: dict[str, Any], integer: bool) -> st.SearchStrategy[Any]:
    """Numbers in and just outside the node's bounds."""
    lo, hi = node.get("minimum"), node.get("maximum")
    lo = -3 if lo is None else lo
    hi = lo + 100 if hi is None else hi
    edges = [lo - 1, lo, hi, hi + 1]
    if integer:
        return st.sampled_from([int(e) for e in edges]) | st.integers(int(lo) - 2, int(hi) + 2)
    return st.sampled_from([float(e) for e in edges]) | st.floats(lo - 1, hi + 1, allow_nan=False)


def values(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """A value for a schema node: mostly well-typed (bounds probed), sometimes a stranger."""
    kind = node.get("type")
    if "enum" in node:
        typed: st.SearchStrategy[Any] = st.sampled_from(node["enum"]) | st.sampled_from(["bogus", ""])
    elif kind == "integer":
        typed = near(node, integer=True)
    elif kind == "number":
        typed = near(node, integer=False)
    elif kind == "boolean":
        typed = st.booleans()
    elif kind == "string":
        longest = node.get("maxLength", 12)
        typed = st.text("abz-09/.:", max_size=min(longest, 16)) | st.just("a" * (longest + 1))
    elif kind == "array" and depth < 2:
        typed = st.lists(
            values(node.get("items") or {}, depth + 1), max_size=min(node.get("maxItems", 3) + 1, 4)
        )
    elif kind == "object" and node.get("properties") and depth < 2:
        props = {k: values(v, depth + 1) for k, v in node["properties"].items()}
        typed = st.fixed_dictionaries({}, optional=props)
    else:
        typed = STRANGERS
    return st.one_of(typed, STRANGERS) if depth == 0 else typed


@st.composite
def specs(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    manifest = copy.deepcopy(draw(st.sampled_from(BASES)))
    edited: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        path, node = draw(st.sampled_from(PATHS))
        target = manifest["spec"]
        for key in path[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[path[-1]] = draw(values(node))
        edited.append(".".join(("spec", *path)))
    return manifest, edited


def local_decision(manifest: dict[str, Any]) -> str | None:
    """None when local mode accepts the manifest, else its message (field paths first)."""
    try:
        RLJobManifest.model_validate(manifest)
    except ValidationError as e:
        return describe(e)
    return None


def named_fields(e: ValidationError) -> list[str]:
    return [field_path(tuple(err.get("loc", ()))) for err in e.errors()]


@pytest.fixture(scope="module")
def rljobs(cluster) -> kclient.CustomObjectsApi:
    install_crd(cluster)
    return kclient.CustomObjectsApi(cluster.api())


@settings(max_examples=120, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(case=specs())
def test_api_server_and_local_mode_agree_and_name_the_field(case, rljobs, namespace) -> None:
    manifest, edited = case
    body = {**manifest, "metadata": {"name": "generated"}}
    try:
        rljobs.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, dry_run="All",
                                               field_validation="Strict")  # fmt: skip
        server = None
    except kclient.ApiException as e:
        assert e.status in (400, 422), f"unexpected {e.status}: {e.body}"
        server = json.loads(e.body).get("message", e.body)
    local = local_decision(manifest)
    where = f"edited {edited}:\n  server: {server}\n  local: {local}"
    assert (server is None) == (local is None), f"the API server and local mode disagree; {where}"
    if server is not None:
        assert "spec." in server, f"the API server's refusal names no field; {where}"
        assert local is not None and local.split(":", 1)[0].startswith("spec"), (
            f"local refusal names no field; {where}"
        )
