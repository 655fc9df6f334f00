"""The docs name no limit the code no longer has, and keep the limits it still has.

Each claim is a set of phrases that, all in one sentence of the README or docs/design.md,
state a limit, and the code fact that decides whether the limit is real: a stale limit
(the fact says otherwise) fails here, and so does a real limit the README stopped naming.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_operator.manifests import (
    PolicyPeers,
    engine_pods,
    executor_deployment,
    network_policies,
    trainer_workload,
)
from rljob_operator.manifests.workload import pod_sets
from rljob_operator.names import PODSET_RAY_WORKERS

from controller_runtime.api.spec import RLJobSpec
from controller_runtime.ports import CellRequest

REPO = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/design.md", "docs/network-policies.md", "operator/rljob_operator/manifests/netpol.py"]
JOBS = Path(__file__).parent / "golden" / "jobs"
URL = "http://rljob-operator.rljob-system.svc:8080"


def _job(case: str = "multinode-vllm", **spec_edits: Any) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((JOBS / f"{case}.yaml").read_text())
    job = copy.deepcopy(job)
    job["spec"].update(spec_edits)
    return job


def _sentences(path: Path) -> list[str]:
    """The file's sentences, whitespace and Markdown emphasis folded, so a claim wrapped over lines matches."""
    text = re.sub(r"\s+", " ", path.read_text().replace("**", ""))
    return [s.strip() for s in re.split(r"(?<=[.;:])\s+", text) if s.strip()]


def _stating(path: Path, phrases: tuple[str, ...]) -> list[str]:
    return [s for s in _sentences(path) if all(p.lower() in s.lower() for p in phrases)]


def _trainer_env() -> dict[str, Any]:
    jobs = [o for o in trainer_workload(_job(), URL) if o["kind"] == "Job"]
    container = jobs[0]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def _executor_replicas_when_suspended() -> int:
    return int(executor_deployment(_job(suspend=True), URL)["spec"]["replicas"])


def _engine_command() -> str:
    """Pod 0's command line, joined (a multi-node cell's is one shell script)."""
    cell = CellRequest(name="multinode-vllm-cell-0", index=0, generation=0)
    c = engine_pods(_job(), cell)[0]["spec"]["containers"][0]
    return " ".join([*c.get("command", []), *c.get("args", [])])


def _operator_admitted_from_every_namespace() -> bool:
    engines = network_policies(_job(), PolicyPeers("rljob-system"))[-1]
    return any(peer.get("namespaceSelector") == {} for rule in engines["spec"]["ingress"] for peer in rule["from"])


def _colocate_refused() -> bool:
    spec = _job()["spec"]
    try:
        RLJobSpec.model_validate({**spec, "trainer": {**spec["trainer"], "colocate": True}})
    except ValueError:
        return True
    return False


def _test_cluster_file(name: str) -> str:
    return (REPO / "tests" / "cluster" / name).read_text()


@dataclass(frozen=True)
class Claim:
    id: str
    phrases: tuple[str, ...]  # all in one sentence: the docs state the limit
    holds: Callable[[], bool]  # whether the code still has the limit
    must_be_named: bool = False  # a real limit the README must keep naming


CLAIMS = [
    Claim(
        "executor-runs-under-kueue",
        ("executor", "keeps running"),
        lambda: _executor_replicas_when_suspended() > 0,
    ),
    Claim(
        "ray-workers-outside-workload",
        ("workers", "not in the Workload"),
        lambda: PODSET_RAY_WORKERS not in {p["name"] for p in pod_sets(_job(), URL)},
    ),
    Claim(
        "engines-without-processed-logprobs",
        ("processed_logprobs", "not pass"),
        lambda: "--logprobs-mode processed_logprobs" not in _engine_command(),
    ),
    Claim(
        "bias-at-temperature",
        ("exact only at temperature 1",),
        lambda: "--logprobs-mode processed_logprobs" not in _engine_command(),
    ),
    Claim(
        "trainer-pods-without-overlap",
        ("no `RLJOB_OVERLAP`",),
        lambda: "RLJOB_OVERLAP" not in _trainer_env(),
    ),
    Claim(
        "test-cluster-without-kube-proxy",
        ("no kube-proxy or DNS",),
        lambda: "kube-proxy" not in _test_cluster_file("README.md"),
    ),
    Claim(
        "test-cluster-without-dns",
        ("test cluster has no DNS",),
        lambda: "COREDNS" not in _test_cluster_file("versions.env"),
    ),
    Claim(
        "operator-label-in-any-namespace",
        ("operator", "in any namespace"),
        _operator_admitted_from_every_namespace,
    ),
    Claim(
        "trainer-metrics-port-unset",
        ("RLJOB_TRAINER_METRICS_PORT", "set nowhere"),
        lambda: "RLJOB_TRAINER_METRICS_PORT" not in _trainer_env(),
    ),
    Claim(
        "colocation-refused",
        ("colocate", "refused"),
        _colocate_refused,
        must_be_named=True,
    ),
    Claim(
        "network-policies-not-enforced",
        ("no NetworkPolicy enforcer",),
        lambda: "kube-network-policies" not in _test_cluster_file("versions.env"),
        must_be_named=True,
    ),
]


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.id for c in CLAIMS])
@pytest.mark.parametrize("doc", DOCS)
def test_docs_name_a_limit_only_while_the_code_has_it(claim: Claim, doc: str) -> None:
    stated = _stating(REPO / doc, claim.phrases)
    if not claim.holds():
        assert not stated, f"{doc} names a limit the code no longer has ({claim.id}): {stated}"
    elif claim.must_be_named and doc == "README.md":
        assert stated, f"README.md no longer names a real limit ({claim.id}): {claim.phrases}"


def test_the_stale_statements_of_the_old_docs_are_caught() -> None:
    """The phrases catch the sentences they were written for (a claim that matches nothing guards nothing)."""
    old = {
        "executor-runs-under-kueue": "Kueue: the executor Deployment keeps running while Kueue holds or evicts a job.",
        "ray-workers-outside-workload": "the workers of an optional `spec.rollout.rayCluster` are not in the Workload.",
        "engines-without-processed-logprobs": "unless started with `--logprobs-mode processed_logprobs`, which "
        "engine cells do not pass yet: the importance",
        "bias-at-temperature": "ratio is exact only at temperature 1 and topP 1.",
        "trainer-pods-without-overlap": "trainer pods get no `RLJOB_OVERLAP` from the operator yet.",
        "test-cluster-without-kube-proxy": "so Services there have no endpoints and there is no kube-proxy or DNS: tests",
        "test-cluster-without-dns": "The test cluster has no DNS, so its multi-rank trainer pods are given",
        "operator-label-in-any-namespace": "The operator is recognised by the chart's pod label in any namespace: a",
        "trainer-metrics-port-unset": "The operator never gives trainer pods a metrics port "
        "(`RLJOB_TRAINER_METRICS_PORT` is set nowhere in `manifests/`).",
        "colocation-refused": "`spec.trainer.colocate` is deprecated and refused (removed in",
        "network-policies-not-enforced": "the test cluster has no NetworkPolicy enforcer, so those are checked",
    }
    assert set(old) == {c.id for c in CLAIMS}
    for claim in CLAIMS:
        sentence = old[claim.id].lower()
        assert all(p.lower() in sentence for p in claim.phrases), claim.id


def test_the_known_limits_section_is_the_last_user_section_and_short() -> None:
    """Known limits stays a list a user reads: one bullet per limit, no CI history in the README."""
    readme = (REPO / "README.md").read_text()
    limits = readme[readme.index("## Known limits") : readme.index("\n## ", readme.index("## Known limits"))]
    assert 3 <= limits.count("\n- ") <= 15
    assert "| commit |" not in readme, "CI history belongs in docs/ci.md"


def test_the_live_edits_table_refuses_every_immutable_field() -> None:
    """Every field the CRD keeps from changing is a refused row of docs/live-edits.md."""
    from tests.unit.crd_cases import IMMUTABLE

    refused = [line for line in (REPO / "docs" / "live-edits.md").read_text().splitlines() if "**refused**" in line]
    for case in IMMUTABLE:
        leaf = case.field.split(".")[-1]
        assert any(leaf in line for line in refused), f"{case.field} is immutable but not a refused row"
