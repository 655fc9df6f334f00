"""Mistakes are refused at the door, with the field named: `kubectl apply` of a bad RLJob,
`helm install` with a bad value. Real kubectl and helm against the test cluster; the
assertions read the text a person would read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.cluster.fixtures import Cluster
from tests.e2e.conftest import CHART
from tests.e2e.rljob_manifest import example


def _cell_spans_partial_node(job: dict[str, Any]) -> None:
    job["spec"]["inference"]["gpusPerEngine"] = 12  # with gpusPerNode 8: a cell of 1.5 nodes
    job["spec"]["inference"].pop("tensorParallelSize")


def _unknown_field(job: dict[str, Any]) -> None:
    job["spec"]["inference"]["gpusPerNodes"] = 8  # a typo of gpusPerNode


def _wrong_type(job: dict[str, Any]) -> None:
    job["spec"]["inference"]["replicas"] = "four"


def _missing_model_source(job: dict[str, Any]) -> None:
    job["spec"]["model"] = {"tokenizer": "x"}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(_cell_spans_partial_node,
                     ["spec.inference.gpusPerEngine", "(12) must be a multiple of spec.inference.gpusPerNode (8)",
                      "use 8 or 16"], id="gpus-per-engine-12-on-8-gpu-nodes"),
        pytest.param(_unknown_field, ['unknown field "spec.inference.gpusPerNodes"'], id="unknown-field"),
        pytest.param(_wrong_type, ["spec.inference.replicas", "integer"], id="wrong-type"),
        pytest.param(_missing_model_source, ["spec.model"], id="no-model-source"),
    ],
)
def test_kubectl_apply_refuses_a_bad_rljob_naming_the_field(
    cluster: Cluster, namespace: str, rljob_crd, mutate: Callable[[dict[str, Any]], None], expected: list[str]
) -> None:
    job = example()
    mutate(job)
    res = cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(job), check=False)
    assert res.returncode != 0, res.stdout
    for text in expected:
        assert text in res.stderr, res.stderr
    left = cluster.kubectl("-n", namespace, "get", "rljobs", "-o", "name").stdout.strip()
    assert left == "", f"a refused RLJob must not exist: {left}"


def test_the_example_itself_is_accepted(cluster: Cluster, namespace: str, rljob_crd) -> None:
    """The control for the cases above: the unmodified example passes the same door."""
    res = cluster.kubectl("-n", namespace, "apply", "--dry-run=server", "-f", "examples/llama-8b-8gpu.yaml")
    assert "rljob.rljob.io/llama-8b-grpo created (server dry run)" in res.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["--set", "replicaCount=0"], ["at '/replicaCount'", "minimum: got 0, want 1"], id="replicas-0"),
        pytest.param(["--set", "scope=everywhere"], ["at '/scope'", "'cluster', 'namespace'"], id="scope"),
        pytest.param(["--set", "replicas=2"], ["additional properties 'replicas' not allowed"], id="typo-key"),
        pytest.param(["--set", "logLevel=LOUD"], ["at '/logLevel'"], id="log-level"),
    ],
)
def test_helm_install_refuses_a_bad_value_naming_it(
    cluster: Cluster, namespace: str, args: list[str], expected: list[str]
) -> None:
    res = cluster.helm("install", "rljob-operator-bad", str(CHART), "-n", namespace, *args, check=False)
    assert res.returncode != 0, res.stdout
    assert "values don't meet the specifications of the schema" in res.stderr, res.stderr
    for text in expected:
        assert text in res.stderr, res.stderr
    releases = json.loads(cluster.helm("list", "-n", namespace, "-a", "-o", "json").stdout)
    assert releases == [], f"nothing may be installed: {releases}"
