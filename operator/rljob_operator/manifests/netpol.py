"""NetworkPolicies the operator makes per job: who may reach the executor's Ray and the engines.

Ray's token (`manifests.rayauth`) refuses a caller without it; these policies keep such
callers from reaching the ports at all, where the cluster's network plugin enforces them:

* `<job>-rollout-ingress` selects the job's executor pod (and its KubeRay pods): the job's
  trainer pods may open the Ray Client port and the shard side channel, nothing else; the
  job's own Ray pods reach each other on every port (head, workers, raylets, object store);
* `<job>-engine-ingress` selects the job's engine pods: the operator (health probes,
  offload/onload, the weight-update window), the job's executor (generation), the job's
  trainer pods (the process-group weight transfer drives the engines' routes and joins
  their group) and the other engine pods of the job (a multi-node cell's Ray/NCCL traffic).

Both also admit the metrics scraper the chart names (`PolicyPeers`), to the metrics port
only: the executor's `/metrics` is on the shard port, an engine's on its HTTP port.

Everything else is refused by the selection itself (a pod selected by an Ingress policy
admits only what some rule allows). The operator is recognised by the chart's pod label
in the operator's own namespace (`kubernetes.io/metadata.name`, which the API server sets
on every namespace and nobody else can): the label alone, in any namespace, would let any
pod that sets it reach every engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rljob_operator import labels as L
from rljob_operator.manifests.executor import RAY_CLIENT_PORT, SHARD_DATA_PORT
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.raycluster import ROLE_RAY
from rljob_operator.names import network_policy_name

OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "rljob-operator"}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class PolicyPeers:
    """Who besides a job's own pods may reach them, from the operator's settings (the chart's values).

    `operator_namespace` empty: no operator pod is admitted (an operator outside the cluster
    reaches no pod through a pod rule anyway). `scraper_namespace` empty: no scraper is
    admitted; `scraper_pod_labels` empty: every pod of that namespace is.
    """

    operator_namespace: str = ""
    scraper_namespace: str = ""
    scraper_pod_labels: Mapping[str, str] = field(default_factory=dict)


def _in_namespace(namespace: str, pod_labels: Mapping[str, str]) -> dict[str, Any]:
    """A peer: pods with these labels (all, when empty) in the namespace of that name."""
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
        "podSelector": {"matchLabels": dict(pod_labels)},
    }


def _scraper_rule(peers: PolicyPeers, port: int) -> list[dict[str, Any]]:
    """The scraper's rule to one metrics port, or none."""
    if not peers.scraper_namespace:
        return []
    peer = _in_namespace(peers.scraper_namespace, peers.scraper_pod_labels)
    return [{"from": [peer], "ports": [{"protocol": "TCP", "port": port}]}]


def _job_pods(view: JobView, *roles: str) -> dict[str, Any]:
    """A podSelector for the job's pods of these roles."""
    return {
        "matchLabels": {L.JOB: L.label_value(view.name)},
        "matchExpressions": [{"key": L.ROLE, "operator": "In", "values": list(roles)}],
    }


def _policy(
    view: JobView, role: str, selected: dict[str, Any], rules: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": view.metadata(network_policy_name(view.name, role), role),
        "spec": {"podSelector": selected, "policyTypes": ["Ingress"], "ingress": rules},
    }


def rollout_network_policy(job: dict[str, Any] | JobView, peers: PolicyPeers | None = None) -> dict[str, Any]:
    view = JobView.of(job)
    peers = peers or PolicyPeers()
    ray_pods = _job_pods(view, L.ROLE_ROLLOUT, ROLE_RAY)
    trainer_ports = [{"protocol": "TCP", "port": p} for p in (RAY_CLIENT_PORT, SHARD_DATA_PORT)]
    rules: list[dict[str, Any]] = [
        {"from": [{"podSelector": _job_pods(view, L.ROLE_TRAINER)}], "ports": trainer_ports},
        {"from": [{"podSelector": ray_pods}]},
        *_scraper_rule(peers, SHARD_DATA_PORT),  # the executor's /metrics
    ]
    return _policy(view, L.ROLE_ROLLOUT, ray_pods, rules)


def engine_network_policy(job: dict[str, Any] | JobView, peers: PolicyPeers | None = None) -> dict[str, Any]:
    view = JobView.of(job)
    peers = peers or PolicyPeers()
    # ROLE_RAY: with spec.rollout.rayCluster the rollout actor generates from the RayCluster's pods.
    sources: list[dict[str, Any]] = [
        {"podSelector": _job_pods(view, L.ROLE_ENGINE, L.ROLE_ROLLOUT, ROLE_RAY, L.ROLE_TRAINER)}
    ]
    if peers.operator_namespace:
        sources.insert(0, _in_namespace(peers.operator_namespace, OPERATOR_POD_LABELS))
    rules = [{"from": sources}, *_scraper_rule(peers, view.spec.inference.port)]  # an engine's /metrics
    return _policy(view, L.ROLE_ENGINE, _job_pods(view, L.ROLE_ENGINE), rules)


def network_policies(job: dict[str, Any] | JobView, peers: PolicyPeers | None = None) -> list[dict[str, Any]]:
    """The job's policies: the rollout's only when the job has an executor (spec.rollout)."""
    view = JobView.of(job)
    if view.spec.rollout is None:
        return [engine_network_policy(view, peers)]
    return [rollout_network_policy(view, peers), engine_network_policy(view, peers)]
