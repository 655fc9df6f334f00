"""The CRD's CEL rules, evaluated with cel-python, and their pydantic mirrors (local mode).

One table of impossible specs (tests/unit/crd_cases.py) goes through both: each case must be
rejected with its message, naming its field, by the CEL rules and by pydantic alike.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from rljob_operator.celcheck import CelChecker
from rljob_operator.crdgen import open_api_schema

from controller_runtime.api import RLJobManifest, RLJobSpec
from tests.unit.crd_cases import (
    IMMUTABLE,
    INVALID,
    MALFORMED,
    MUTABLE_EDITS,
    VALID_EDITS,
    Case,
    Malformed,
    edited,
    load_manifest,
)


@pytest.fixture(scope="module")
def checker() -> CelChecker:
    return CelChecker(open_api_schema())


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_cel_rejects_impossible_spec(checker: CelChecker, case: Case) -> None:
    violations = checker.violations(case.manifest())
    assert [(v.field, v.message) for v in violations] == [(case.field, case.message)]


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_pydantic_rejects_impossible_spec_with_the_same_message(case: Case) -> None:
    with pytest.raises(ValidationError) as err:
        RLJobManifest.model_validate(case.manifest())
    text = str(err.value)
    assert case.message in text
    assert case.field in text


@pytest.mark.parametrize("name", sorted(VALID_EDITS))
def test_specs_near_the_rules_pass_both(checker: CelChecker, name: str) -> None:
    manifest = edited(load_manifest(), VALID_EDITS[name])
    assert checker.violations(manifest) == []
    RLJobManifest.model_validate(manifest)


@pytest.mark.parametrize("case", IMMUTABLE, ids=lambda c: c.id)
def test_cel_rejects_change_of_immutable_field(checker: CelChecker, case: Case) -> None:
    new, old = case.manifest(), case.old_manifest()
    assert checker.violations(new) == [], "the new object alone is valid; only the change is not"
    violations = checker.violations(new, old)
    assert [(v.field, v.message) for v in violations] == [(case.field, case.message)]


@pytest.mark.parametrize("case", IMMUTABLE, ids=lambda c: c.id)
def test_validate_update_rejects_change_of_immutable_field(case: Case) -> None:
    new = RLJobSpec.model_validate(case.manifest()["spec"])
    old = RLJobSpec.model_validate(case.old_manifest()["spec"])
    with pytest.raises(ValueError, match="immutable") as err:
        new.validate_update(old)
    assert str(err.value) == case.message
    assert case.field in str(err.value)


@pytest.mark.parametrize("name", sorted(MUTABLE_EDITS))
def test_changes_of_mutable_fields_pass(checker: CelChecker, name: str) -> None:
    old = load_manifest()
    new = edited(old, MUTABLE_EDITS[name])
    assert checker.violations(new, old) == []
    RLJobSpec.model_validate(new["spec"]).validate_update(RLJobSpec.model_validate(old["spec"]))


def test_every_rule_is_pinned_by_a_case(checker: CelChecker) -> None:
    """A rule no case breaks is a rule nobody knows works."""
    broken = {v.rule for case in INVALID for v in checker.violations(case.manifest())}
    broken |= {v.rule for case in IMMUTABLE for v in checker.violations(case.manifest(), case.old_manifest())}
    assert set(checker.rules) - broken == set()


def test_transition_rules_are_skipped_on_create(checker: CelChecker) -> None:
    """oldSelf exists only on update; on create the immutability rules must not run."""
    assert checker.violations(load_manifest()) == []


def test_rule_evaluation_error_is_a_violation() -> None:
    """A rule that cannot be evaluated rejects the object, as the API server does."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "number"}},
        "x-kubernetes-validations": [{"rule": "self.n == 1", "message": "n must be 1"}],
    }
    (violation,) = CelChecker(schema).violations({"n": 1})
    assert "could not be evaluated" in violation.message  # double == int has no overload


def test_defaults_fill_fields_before_rules_run(checker: CelChecker) -> None:
    """Rules read defaulted fields (trainer.colocate, offload.enabled...) that a manifest may omit."""
    minimal = {
        "apiVersion": "rljob.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "m"},
        "spec": {"model": {"path": "/m"}, "inference": {}, "rollout": {"dataset": {"path": "/d.jsonl"}}},
    }
    assert checker.violations(minimal) == []
    assert checker.violations(edited(minimal, {"spec.inference.gpusPerEngine": 9})) != []


@pytest.mark.parametrize("case", MALFORMED, ids=lambda c: c.id)
def test_pydantic_refuses_malformed_spec_naming_the_field(case: Malformed) -> None:
    """Local mode refuses what the API server's schema refuses (unknown fields included)."""
    with pytest.raises(ValidationError) as err:
        RLJobManifest.model_validate(case.manifest())
    assert case.field in str(err.value)
