"""crds/rljob.yaml against a real kube-apiserver, through kubectl as a user meets it.

The same table of impossible specs that tests/unit/test_cel_rules.py runs through cel-python
and pydantic is applied here with `kubectl apply`: each must be refused, and the error must
name the field and carry the message. Also: the API server accepts the CRD at all (structural
schema, CEL cost budget), refuses unknown fields (kubectl's default strict field validation),
wrong types and negative counts, defaults a spec the way pydantic does, enforces immutable
fields on update, and shows the printer columns.

The CRD is server-side applied and left installed: it is cluster-wide and other tests' RLJobs
need it too.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from controller_runtime.api import RLJobSpec, RLJobStatus
from tests.unit.crd_cases import (
    EXAMPLES,
    IMMUTABLE,
    INVALID,
    MALFORMED,
    MUTABLE_EDITS,
    REPO_ROOT,
    Case,
    Malformed,
    edited,
    load_manifest,
    sample,
)

pytestmark = pytest.mark.cluster

CRD_FILE = REPO_ROOT / "crds" / "rljob.yaml"


@pytest.fixture(scope="module")
def crd(cluster) -> Any:
    """Install (or update) the CRD and wait until the API server serves it."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=rljob-crd-test", "-f", str(CRD_FILE))
    cluster.wait_established("rljobs.rljob.io")
    # Established can precede discovery by a moment; wait until kubectl resolves the short name.
    cluster.wait_for(lambda: cluster.kubectl("get", "rlj", "-A", check=False).returncode == 0, timeout=60,
                     what="kubectl get rlj")
    return cluster


@pytest.fixture(scope="module")
def table_ns(crd) -> Iterator[str]:
    """One namespace for the table cases (refused objects leave nothing behind)."""
    name = f"t-crd-table-{uuid.uuid4().hex[:6]}"
    crd.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        crd.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _named(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    out = dict(manifest)
    out["metadata"] = {"name": name[:63].rstrip("-")}
    return out


def apply(cluster, namespace: str, manifest: dict[str, Any], *extra: str):
    return cluster.kubectl("apply", "-n", namespace, *extra, "-f", "-", input=yaml.safe_dump(manifest), check=False)


def get_json(cluster, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "rljob", name, "-n", namespace, "-o", "json").stdout)


def test_crd_is_accepted_and_established(crd) -> None:
    out = json.loads(crd.kubectl("get", "crd", "rljobs.rljob.io", "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in out["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert conditions.get("NamesAccepted") == "True"
    assert out["status"]["acceptedNames"]["shortNames"] == ["rlj"]


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_impossible_spec_is_refused_naming_the_field(crd, table_ns: str, case: Case) -> None:
    res = apply(crd, table_ns, _named(case.manifest(), f"inv-{case.id}"))
    assert res.returncode != 0, f"accepted: {res.stdout}"
    assert f"{case.field}: Invalid value" in res.stderr, res.stderr
    assert case.message in res.stderr, res.stderr




@pytest.mark.parametrize("case", MALFORMED, ids=lambda c: c.id)
def test_malformed_spec_is_refused(crd, table_ns: str, case: Malformed) -> None:
    res = apply(crd, table_ns, _named(edited(load_manifest(), case.edits), f"bad-{case.id}"))
    assert res.returncode != 0, f"accepted: {res.stdout}"
    assert case.field in res.stderr, res.stderr
    assert case.apiserver_says in res.stderr, res.stderr


def test_unknown_field_is_pruned_when_validation_is_off(crd, namespace: str) -> None:
    """Without strict field validation the API server drops the field silently: why strict matters."""
    res = apply(crd, namespace, _named(edited(load_manifest(), {"spec.inference.gpuPerEngine": 2}), "pruned"),
                "--validate=false")
    assert res.returncode == 0, res.stderr
    assert "gpuPerEngine" not in get_json(crd, namespace, "pruned")["spec"]["inference"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted_and_defaulted_like_pydantic(crd, namespace: str, path) -> None:
    manifest = yaml.safe_load(path.read_text())
    res = apply(crd, namespace, manifest)
    assert res.returncode == 0, res.stderr
    stored = get_json(crd, namespace, manifest["metadata"]["name"])["spec"]
    assert stored["inference"]["healthCheck"]["failureThreshold"] == 3  # filled in by the API server
    default_image = RLJobSpec.model_fields["trainer"].default_factory().image
    assert stored["trainer"]["image"] == manifest["spec"].get("trainer", {}).get("image", default_image)
    assert RLJobSpec.model_validate(stored) == RLJobSpec.model_validate(manifest["spec"])


def test_reapplying_an_unchanged_example_is_allowed(crd, namespace: str) -> None:
    manifest = load_manifest()
    for _ in range(2):
        res = apply(crd, namespace, manifest)
        assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("case", IMMUTABLE, ids=lambda c: c.id)
def test_change_of_immutable_field_is_refused(crd, table_ns: str, case: Case) -> None:
    name = f"imm-{case.id}"
    res = apply(crd, table_ns, _named(case.old_manifest(), name))
    assert res.returncode == 0, res.stderr
    res = apply(crd, table_ns, _named(case.manifest(), name))
    assert res.returncode != 0, f"accepted: {res.stdout}"
    assert f"{case.field}: Invalid value" in res.stderr, res.stderr
    assert case.message in res.stderr, res.stderr


def test_change_of_mutable_fields_is_accepted(crd, namespace: str) -> None:
    base = _named(load_manifest(), "mutable")
    assert apply(crd, namespace, base).returncode == 0
    for edits in MUTABLE_EDITS.values():
        base = edited(base, edits)
        res = apply(crd, namespace, base)
        assert res.returncode == 0, f"{edits}: {res.stderr}"
    stored = get_json(crd, namespace, "mutable")["spec"]
    assert stored["inference"]["replicas"] == 8 and stored["trainer"]["replicas"] == 2 and stored["suspend"] is True


def test_printer_columns_show_status(crd, namespace: str) -> None:
    manifest = _named(load_manifest(), "columns")
    assert apply(crd, namespace, manifest).returncode == 0
    status = {"phase": "Running", "ready": "3/4", "weightVersion": "v7", "rolloutId": 12,
              "queue": {"name": "rl", "state": "Admitted"}}
    crd.kubectl("patch", "rljob", "columns", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}))
    header, row = crd.kubectl("get", "rlj", "columns", "-n", namespace).stdout.splitlines()
    assert header.split() == ["NAME", "PHASE", "READY", "WEIGHTS", "ROLLOUT", "QUEUE", "PASS@1", "AGE"]
    assert row.split()[:6] == ["columns", "Running", "3/4", "v7", "12", "Admitted"]


def test_status_schema_is_enforced(crd, namespace: str) -> None:
    manifest = _named(load_manifest(), "status-check")
    assert apply(crd, namespace, manifest).returncode == 0
    res = crd.kubectl("patch", "rljob", "status-check", "-n", namespace, "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": {"phase": "Exploded"}}), check=False)
    assert res.returncode != 0 and "status.phase" in res.stderr, res.stderr


def test_kubectl_explain_shows_descriptions(crd) -> None:
    out = crd.kubectl("explain", "rlj.spec.inference.gpusPerEngine").stdout
    assert "GPUs of one engine" in out


def test_null_label_field_is_kept_by_the_api_server(crd, namespace: str) -> None:
    """`nullable: true` keeps `labelField: null` (no label) instead of defaulting it to "label".

    Client-side `kubectl apply` strips nulls before sending, so examples write "" instead.
    """
    manifest = _named(edited(load_manifest(), {"spec.rollout.dataset.labelField": None}), "null-label")
    res = apply(crd, namespace, manifest, "--server-side")
    assert res.returncode == 0, res.stderr
    dataset = get_json(crd, namespace, "null-label")["spec"]["rollout"]["dataset"]
    assert "labelField" in dataset and dataset["labelField"] is None


def test_full_status_round_trips_through_the_status_subresource(crd, namespace: str) -> None:
    """Every status field the operator writes is stored, none pruned."""
    assert apply(crd, namespace, _named(load_manifest(), "full-status")).returncode == 0
    wire = RLJobStatus.model_validate(sample(RLJobStatus)).to_wire()
    crd.kubectl("patch", "rljob", "full-status", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": wire}))
    assert get_json(crd, namespace, "full-status")["status"] == wire


def test_pod_template_schema_is_served(crd, namespace: str) -> None:
    """The template carries the real PodSpec schema: explained, applied, and a misspelt pod field refused."""
    out = crd.kubectl("explain", "rlj.spec.inference.template.spec.schedulerName").stdout
    assert "schedulerName" in out and "<string>" in out
    manifest = yaml.safe_load((REPO_ROOT / "tests" / "unit" / "golden" / "jobs" / "pod-templates.yaml").read_text())
    manifest["metadata"] = {"name": "with-templates"}
    res = apply(crd, namespace, manifest)
    assert res.returncode == 0, res.stderr
    stored = get_json(crd, namespace, "with-templates")["spec"]
    assert stored["inference"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] == "32Gi"
    # The API server fills in the PodSpec's own defaults (a port's protocol: TCP, a list-map key)
    # that the models keep as given; the pods built from either are the same once created.
    sidecar_port = stored["inference"]["template"]["spec"]["containers"][1]["ports"][0]
    assert sidecar_port["protocol"] == "TCP"
    given = copy.deepcopy(manifest["spec"])
    given["inference"]["template"]["spec"]["containers"][1]["ports"][0]["protocol"] = "TCP"
    assert RLJobSpec.model_validate(stored) == RLJobSpec.model_validate(given)
    bad = edited(manifest, {"spec.trainer.template.spec.hostNetwrk": True})
    bad["metadata"] = {"name": "misspelt"}
    res = apply(crd, namespace, bad)
    assert res.returncode != 0 and "spec.trainer.template.spec.hostNetwrk" in res.stderr, res.stderr
