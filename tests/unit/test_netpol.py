"""The job NetworkPolicies: the operator admitted from its own namespace only, the metrics
scraper the chart names admitted to the metrics ports only, and the settings that carry both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from rljob_operator import labels as L
from rljob_operator.handlers import policy_peers
from rljob_operator.manifests import PolicyPeers, network_policies, trainer_workload
from rljob_operator.manifests.executor import SHARD_DATA_PORT
from rljob_operator.manifests.netpol import NAMESPACE_NAME_LABEL, OPERATOR_POD_LABELS
from rljob_operator.manifests.trainer import METRICS_PORT
from rljob_operator.settings import load_settings

JOBS = Path(__file__).parent / "golden" / "jobs"
PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}
PEERS = PolicyPeers("rljob-system", "monitoring", PROMETHEUS)


def job(case: str = "gpu-4x2") -> dict[str, Any]:
    return yaml.safe_load((JOBS / f"{case}.yaml").read_text())


def policy(role: str, peers: PolicyPeers | None = PEERS, case: str = "gpu-4x2") -> dict[str, Any]:
    return next(p for p in network_policies(job(case), peers) if p["metadata"]["labels"][L.ROLE] == role)


def peers_of(p: dict[str, Any]) -> list[tuple[dict[str, Any], list[int] | None]]:
    """(peer, its rule's ports or None for every port) for every peer of the policy."""
    return [(peer, [x["port"] for x in rule["ports"]] if "ports" in rule else None)
            for rule in p["spec"]["ingress"] for peer in rule["from"]]  # fmt: skip


def test_the_operator_reaches_engines_only_from_its_own_namespace() -> None:
    """Any pod labelled like the operator in another namespace is no longer admitted."""
    operator = [peer for peer, _ in peers_of(policy(L.ROLE_ENGINE))
                if peer.get("podSelector", {}).get("matchLabels") == OPERATOR_POD_LABELS]  # fmt: skip
    assert operator == [{
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "rljob-system"}},
        "podSelector": {"matchLabels": OPERATOR_POD_LABELS},
    }]


@pytest.mark.parametrize("role", [L.ROLE_ENGINE, L.ROLE_ROLLOUT])
def test_no_peer_names_every_namespace(role: str) -> None:
    for peer, _ in peers_of(policy(role, case="multinode-vllm")):
        if "namespaceSelector" in peer:
            assert set(peer["namespaceSelector"]["matchLabels"]) == {NAMESPACE_NAME_LABEL}, peer


def test_without_an_operator_namespace_no_operator_pod_is_admitted() -> None:
    selectors = [peer.get("podSelector", {}).get("matchLabels") for peer, _ in peers_of(policy(L.ROLE_ENGINE, None))]
    assert OPERATOR_POD_LABELS not in selectors


@pytest.mark.parametrize(("role", "port"), [(L.ROLE_ENGINE, 8000), (L.ROLE_ROLLOUT, SHARD_DATA_PORT)])
def test_the_scraper_reaches_the_metrics_port_and_nothing_else(role: str, port: int) -> None:
    scraper = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "monitoring"}},
               "podSelector": {"matchLabels": PROMETHEUS}}  # fmt: skip
    assert [ports for peer, ports in peers_of(policy(role)) if peer == scraper] == [[port]]
    assert job()["spec"]["inference"].get("port", 8000) == 8000


@pytest.mark.parametrize("role", [L.ROLE_ENGINE, L.ROLE_ROLLOUT])
def test_no_scraper_is_admitted_unless_one_is_named(role: str) -> None:
    unnamed = PolicyPeers("rljob-system")
    assert all(peer.get("namespaceSelector", {}).get("matchLabels", {}).get(NAMESPACE_NAME_LABEL) != "monitoring"
               for peer, _ in peers_of(policy(role, unnamed)))  # fmt: skip
    assert len(policy(role, unnamed)["spec"]["ingress"]) == len(policy(role)["spec"]["ingress"]) - 1


def test_a_scraper_namespace_without_labels_admits_every_pod_of_it() -> None:
    scraper = [peer for peer, ports in peers_of(policy(L.ROLE_ENGINE, PolicyPeers("rljob-system", "monitoring")))
               if ports == [8000]]  # fmt: skip
    assert scraper == [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "monitoring"}},
                        "podSelector": {"matchLabels": {}}}]  # fmt: skip


def test_trainer_ranks_serve_metrics_on_the_port_they_declare() -> None:
    trainer = next(o for o in trainer_workload(job(), "http://op:8080") if o["kind"] == "Job")
    c = trainer["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert env["RLJOB_TRAINER_METRICS_PORT"] == str(METRICS_PORT) and ports["metrics"] == METRICS_PORT


def test_the_chart_arguments_become_the_peers() -> None:
    s = load_settings(["-A", "--operator-namespace=ops", "--metrics-scraper-namespace=monitoring",
                       "--metrics-scraper-labels=app.kubernetes.io/name=prometheus,team=ml"], env={})  # fmt: skip
    assert policy_peers(s) == PolicyPeers("ops", "monitoring", {"app.kubernetes.io/name": "prometheus", "team": "ml"})


def test_the_operator_namespace_defaults_to_the_pods_then_the_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "from-pod")
    assert policy_peers(load_settings(["-n", "a"], env={})).operator_namespace == "from-pod"
    monkeypatch.delenv("POD_NAMESPACE")
    assert policy_peers(load_settings(["-n", "a"], env={})) == PolicyPeers("a")


def test_bad_scraper_labels_are_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError, match="metrics_scraper_labels"):
        load_settings(["-A", "--metrics-scraper-labels=app prometheus"], env={})
