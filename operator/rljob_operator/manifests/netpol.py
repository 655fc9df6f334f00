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

Everything else is refused by the selection itself (a pod selected by an Ingress policy
admits only what some rule allows). The operator is recognised by the chart's pod label
in any namespace: a NetworkPolicy cannot name a release, and the label is the chart's
constant selector.
"""

from __future__ import annotations

from typing import Any

from rljob_operator import labels as L
from rljob_operator.manifests.executor import RAY_CLIENT_PORT, SHARD_DATA_PORT
from rljob_operator.manifests.job import JobView
from rljob_operator.manifests.raycluster import ROLE_RAY
from rljob_operator.names import network_policy_name

OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "rljob-operator"}


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


def rollout_network_policy(job: dict[str, Any] | JobView) -> dict[str, Any]:
    view = JobView.of(job)
    ray_pods = _job_pods(view, L.ROLE_ROLLOUT, ROLE_RAY)
    trainer_ports = [{"protocol": "TCP", "port": p} for p in (RAY_CLIENT_PORT, SHARD_DATA_PORT)]
    rules: list[dict[str, Any]] = [
        {"from": [{"podSelector": _job_pods(view, L.ROLE_TRAINER)}], "ports": trainer_ports},
        {"from": [{"podSelector": ray_pods}]},
    ]
    return _policy(view, L.ROLE_ROLLOUT, ray_pods, rules)


def engine_network_policy(job: dict[str, Any] | JobView) -> dict[str, Any]:
    view = JobView.of(job)
    operator: dict[str, Any] = {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
    }
    # ROLE_RAY: with spec.rollout.rayCluster the rollout actor generates from the RayCluster's pods.
    peers: dict[str, Any] = {"podSelector": _job_pods(view, L.ROLE_ENGINE, L.ROLE_ROLLOUT, ROLE_RAY, L.ROLE_TRAINER)}
    return _policy(view, L.ROLE_ENGINE, _job_pods(view, L.ROLE_ENGINE), [{"from": [operator, peers]}])


def network_policies(job: dict[str, Any] | JobView) -> list[dict[str, Any]]:
    """The job's policies: the rollout's only when the job has an executor (spec.rollout)."""
    view = JobView.of(job)
    if view.spec.rollout is None:
        return [engine_network_policy(view)]
    return [rollout_network_policy(view), engine_network_policy(view)]
