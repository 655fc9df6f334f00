"""crds/rljob.yaml: generated from the pydantic models, current, structural, and what kubectl shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from rljob_operator import apidoc, crdgen
from rljob_operator.celcheck import CelChecker
from rljob_operator.podschema import embedded_kind
from rljob_operator.structural import apply_defaults, pruned_paths, walk

from controller_runtime.api import RLJobSpec, RLJobStatus
from tests.unit.crd_cases import sample


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return crdgen.build_crd()


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_is_current() -> None:
    committed = crdgen.CRD_PATH.read_text() if crdgen.CRD_PATH.exists() else ""
    assert committed == crdgen.render(crdgen.build_crd()), (
        f"crds/rljob.yaml is stale: regenerate it with `{crdgen.REGENERATE}` and commit it"
    )


def test_check_mode_fails_on_a_stale_file_and_passes_on_a_fresh_one(tmp_path: Path, capsys) -> None:
    out = tmp_path / "rljob.yaml"
    out.write_text("stale\n")
    assert crdgen.main(["--check", "--output", str(out)]) == 1
    assert crdgen.REGENERATE in capsys.readouterr().err
    assert crdgen.main(["--output", str(out)]) == 0
    assert crdgen.main(["--check", "--output", str(out)]) == 0


def test_generation_is_byte_identical() -> None:
    assert crdgen.render(crdgen.build_crd()) == crdgen.render(crdgen.build_crd())


def test_file_is_one_plain_yaml_document() -> None:
    text = crdgen.render(crdgen.build_crd())
    assert "&id" not in text and "*id" not in text, "no YAML anchors: kubectl users read this file"
    (doc,) = list(yaml.safe_load_all(text))
    assert doc["kind"] == "CustomResourceDefinition"


def test_names_scope_and_version(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "rljobs.rljob.io"
    assert spec["group"] == "rljob.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "RLJob", "listKind": "RLJobList", "plural": "rljobs", "singular": "rljob",
        "shortNames": ["rlj"], "categories": ["rljob"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns(crd: dict[str, Any]) -> None:
    columns = {(c["name"], c["type"], c["jsonPath"]) for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns == {
        ("Phase", "string", ".status.phase"),
        ("Ready", "string", ".status.ready"),
        ("Weights", "string", ".status.weightVersion"),
        ("Rollout", "integer", ".status.rolloutId"),
        ("Queue", "string", ".status.queue.state"),
        ("Pass@1", "number", ".status.lastEval.passAt1"),
        ("Age", "date", ".metadata.creationTimestamp"),
    }


def test_printer_columns_point_at_status_fields(schema: dict[str, Any], crd: dict[str, Any]) -> None:
    status = schema["properties"]["status"]["properties"]
    for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
        root, *path = column["jsonPath"].lstrip(".").split(".")
        if root == "status":
            field: dict[str, Any] = {"properties": status}
            for name in path:
                assert name in field.get("properties", {}), column
                field = field["properties"][name]
            assert field["type"] == column["type"], column


def ours(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """`walk`, without the insides of embedded Kubernetes types (PodSpec, EnvVarSource): those are the Pod API's."""
    embedded = [p for p, node in walk(schema, path) if embedded_kind(node) is not None]
    return [(p, node) for p, node in walk(schema, path) if not any(p.startswith(e) and p != e for e in embedded)]


FORBIDDEN_KEYS = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const", "definitions"}


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    """What the API server demands of a structural schema (apiextensions validation)."""
    for path, node in walk(schema):
        assert not FORBIDDEN_KEYS & set(node), f"{path}: {FORBIDDEN_KEYS & set(node)}"
        has_type = "type" in node or node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert has_type, f"{path} has no type"
        extra = node.get("additionalProperties")
        assert extra is None or isinstance(extra, dict), f"{path}: additionalProperties must be a schema"
        assert not (extra is not None and "properties" in node), f"{path}: properties and additionalProperties"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(bound, True), bool), f"{path}: {bound} must be a bool in OpenAPI v3.0"
        if "nullable" in node:
            assert "type" in node, path
    assert set(schema["properties"]["metadata"]) == {"type"}, "metadata may only say type: object"


def test_unknown_fields_are_not_preserved_in_spec(schema: dict[str, Any]) -> None:
    """Only free-form blocks keep unknown fields; everything else is pruned (and rejected by kubectl)."""
    preserved = {path for path, node in ours(schema["properties"]["spec"]) if node.get("x-kubernetes-preserve-unknown-fields")}
    assert preserved == {".inference.placement.affinity", ".trainer.placement.affinity", ".rollout.reward.args",
                         ".rollout.functionArgs"}


def test_every_spec_and_status_field_is_described(schema: dict[str, Any]) -> None:
    missing = [
        path for part in ("spec", "status")
        for path, node in ours(schema["properties"][part], part)
        if not path.endswith("[]") and not path.endswith("{}") and not node.get("description")
    ]
    assert missing == []


def test_crd_defaults_equal_pydantic_defaults(schema: dict[str, Any]) -> None:
    """The API server fills a minimal spec exactly as local mode does."""
    minimal = {"model": {"path": "/m"}, "inference": {}, "rollout": {"dataset": {"path": "/d.jsonl"}}}
    defaulted = apply_defaults(minimal, schema["properties"]["spec"])
    assert RLJobSpec.model_validate(defaulted) == RLJobSpec.model_validate(minimal)
    assert defaulted["inference"]["healthCheck"]["failureThreshold"] == 3
    assert defaulted["inference"]["offload"]["tags"] == ["weights", "kv_cache", "cuda_graph"]
    assert "placement" not in defaulted["inference"], "empty blocks get no default: absent means empty"


def test_null_kept_only_where_it_differs_from_unset(schema: dict[str, Any]) -> None:
    """labelField: null means "no label"; other nulls mean "unset" and are pruned, as pydantic treats None."""
    nullable = {path for path, node in walk(schema["properties"]["spec"]) if node.get("nullable")}
    assert nullable == {".rollout.dataset.labelField"}
    dataset = apply_defaults({"path": "/d", "labelField": None, "format": None},
                             schema["properties"]["spec"]["properties"]["rollout"]["properties"]["dataset"])
    assert dataset["labelField"] is None
    assert "format" not in dataset


def test_cel_rules_sit_outside_lists_or_under_bounded_ones(schema: dict[str, Any]) -> None:
    """The API server multiplies a rule's cost by how often it can run; transition rules need no list above."""
    for path, node in walk(schema):
        if not node.get("x-kubernetes-validations"):
            continue
        assert "[]" not in path and "{}" not in path, f"{path}: rules under a list or map need maxItems bounds"
        for rule in node["x-kubernetes-validations"]:
            assert rule["message"] and len(rule["message"]) < 400


def test_strings_compared_by_transition_rules_are_bounded(schema: dict[str, Any]) -> None:
    """`self == oldSelf` on spec.model costs as much as its longest string may be."""
    for path, node in walk(schema["properties"]["spec"]["properties"]["model"], "spec.model"):
        if node.get("type") == "string":
            assert "maxLength" in node, path


def test_every_model_field_reaches_the_schema(schema: dict[str, Any]) -> None:
    """No field silently lost in conversion."""

    def names(model: type[BaseModel]) -> set[str]:
        return {f.alias or n for n, f in model.model_fields.items()}

    assert set(schema["properties"]["spec"]["properties"]) == names(RLJobSpec)


def test_unions_other_than_optional_are_refused() -> None:
    class Bad(BaseModel):
        x: int | str

    with pytest.raises(crdgen.UnsupportedSchema, match="anyOf"):
        crdgen.structural_schema(Bad, keep_defaults=True)


def test_committed_api_reference_is_current() -> None:
    committed = apidoc.DOC_PATH.read_text() if apidoc.DOC_PATH.exists() else ""
    assert committed == apidoc.render(), (
        f"docs/api-reference.md is stale: regenerate it with `{apidoc.REGENERATE}` and commit it"
    )


def test_api_reference_check_mode(tmp_path: Path) -> None:
    out = tmp_path / "ref.md"
    assert apidoc.main(["--check", "--output", str(out)]) == 1
    assert apidoc.main(["--output", str(out)]) == 0
    assert apidoc.main(["--check", "--output", str(out)]) == 0


def test_api_reference_covers_every_field_and_rule(schema: dict[str, Any]) -> None:
    text = apidoc.render(schema)
    for part in ("spec", "status"):
        for path, node in ours(schema["properties"][part], part):
            if "properties" in node and embedded_kind(node) is None:
                assert f"### `{path}`" in text, path
                for name in node["properties"]:
                    assert f"`{name}`" in text, f"{path}.{name}"
            for rule in node.get("x-kubernetes-validations", []):
                assert rule["rule"].replace("|", "\\|") in text
                assert rule["message"].replace("<", "&lt;").replace(">", "&gt;") in text


def test_api_reference_shows_defaults_and_bounds() -> None:
    text = apidoc.render()
    row = next(line for line in text.splitlines() if line.startswith("| `gpusPerNode` |"))
    assert "`8`" in row and "≥ 1" in row and "≤ 64" in row and "Immutable" in row


def test_object_defaults_pass_their_own_rules_as_written(schema: dict[str, Any]) -> None:
    """The API server checks a `default` against its object's CEL rules without filling nested
    defaults first; `default: {}` under a rule that reads a field is refused ("no such key")."""
    checked = 0
    for path, node in walk(schema):
        if "default" in node and node.get("x-kubernetes-validations"):
            rules_only = {k: v for k, v in node.items() if k != "default"}
            assert CelChecker(rules_only).violations(node["default"], defaults=False) == [], path
            checked += 1
    assert checked >= 2  # offload, restartPolicy


def test_message_expressions_avoid_string_conversion(schema: dict[str, Any]) -> None:
    """The API server prices `string(int)` as an unbounded string and refuses the CRD for it
    (measured on kube-apiserver v1.36: "cost exceeds budget by factor of more than 100x");
    `'%d'.format([...])` is priced by its arguments."""
    for path, node in walk(schema):
        for rule in node.get("x-kubernetes-validations", []):
            assert "string(" not in rule.get("messageExpression", ""), path


def test_cel_format_formats_like_kubernetes() -> None:
    from celpy import celtypes
    from rljob_operator.celcheck import cel_format

    args = celtypes.ListType([celtypes.IntType(12), celtypes.StringType("x"), celtypes.DoubleType(0.5)])
    assert cel_format(celtypes.StringType("%d of %s at %.2f, 100%%"), args) == "12 of x at 0.50, 100%"
    with pytest.raises(ValueError, match="unsupported verb"):
        cel_format(celtypes.StringType("%q"), celtypes.ListType([celtypes.IntType(1)]))
    with pytest.raises(ValueError, match="needs an integer"):
        cel_format(celtypes.StringType("%d"), celtypes.ListType([celtypes.StringType("1")]))


def test_every_status_field_the_operator_writes_survives_pruning(schema: dict[str, Any]) -> None:
    """The status subresource drops unknown fields silently; every field the models write must have a home."""
    wire = RLJobStatus.model_validate(sample(RLJobStatus)).to_wire()
    assert len(wire) == len(RLJobStatus.model_fields)
    assert pruned_paths(wire, schema["properties"]["status"], "status") == []
    assert pruned_paths({"spec": {"bogus": 1}}, schema) == [".spec.bogus"]


def test_every_spec_field_survives_pruning(schema: dict[str, Any]) -> None:
    raw = sample(RLJobSpec)
    raw["rollout"]["reward"]["function"] = "module:function"
    raw["inference"]["engine"] = "sglang"  # a name of the engine table (the field is a str checked against it)
    raw["rollout"]["function"] = "module:rollout"
    del raw["trainer"]["command"]  # exclusive with workloadRef
    raw["trainer"]["colocate"] = False  # refused when true
    raw["trainer"]["workloadRef"].update(apiVersion="batch/v1", kind="Job")  # a kind the operator follows
    raw["trainer"]["reference"]["offPolicy"]["tisCap"] = 2.0  # the sample's 0.5 is below the cap's minimum of 1
    for role in ("inference", "trainer"):  # Kubernetes types: a value of the real shape, not the sampler's
        raw[role]["env"] = [{"name": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    for role in ("inference", "rollout", "trainer"):
        raw[role]["template"]["spec"] = {"volumes": [{"name": "v", "emptyDir": {}}], "containers": [{"name": "side"}]}
    # a source from the hub excludes a PVC: each shape on its own
    hub_model = {"uri": "hf://org/name@rev", "credentialsSecret": "x", "cache": raw["model"]["pvc"], "tokenizer": "x"}
    del raw["model"]["uri"]
    hub_dataset = dict(raw["rollout"]["dataset"], uri="hf://org/data@rev")
    del hub_dataset["pvc"], raw["rollout"]["dataset"]["uri"]
    for model, dataset in ((raw["model"], raw["rollout"]["dataset"]), (hub_model, hub_dataset)):
        wire = RLJobSpec.model_validate(dict(raw, model=model, rollout=dict(raw["rollout"], dataset=dataset))).to_wire()
        assert pruned_paths(wire, schema["properties"]["spec"], "spec") == []
        assert CelChecker(schema).violations({"spec": wire}) == []
