"""What environment the test cluster's process agent gives a pod's process (tests/cluster/agent.py).

The bug this guards: the agent copied its own environment into every pod. Started from a shell
that had exported the loopback cluster's KUBECONFIG, the pod-network cluster's in-cluster
operator pods used that file instead of their ServiceAccount, reached nothing from their network
namespace, and two e2e tests failed (test_kuberay_rollout, test_tiny_cluster_loop)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

CLUSTER = Path(__file__).resolve().parents[1] / "cluster"


def agent_class() -> Any:
    """The agent is a script that imports its neighbour `podnet` by its directory on sys.path."""
    if str(CLUSTER) not in sys.path:
        sys.path.insert(0, str(CLUSTER))
    return importlib.import_module("agent").Agent


def pod(*env: client.V1EnvVar) -> tuple[client.V1Pod, client.V1Container]:
    c = client.V1Container(name="main", command=["python"], env=list(env))
    return client.V1Pod(metadata=client.V1ObjectMeta(name="p", namespace="ns", uid="u-1"),
                        spec=client.V1PodSpec(containers=[c])), c  # fmt: skip


def test_a_pod_in_its_own_network_gets_the_kubernetes_service_not_the_hosts_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/host/loopback-kubeconfig")
    agent = agent_class()(client.ApiClient(), tmp_path, podnet=object(), kubernetes_service="10.96.0.1:443")
    env = agent.build_env(*pod())
    assert "KUBECONFIG" not in env
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("10.96.0.1", "443")
    # a pod that sets KUBECONFIG itself keeps it
    env = agent.build_env(*pod(client.V1EnvVar(name="KUBECONFIG", value="/etc/mine")))
    assert env["KUBECONFIG"] == "/etc/mine"


def test_a_loopback_pod_keeps_the_hosts_kubeconfig_its_only_way_to_the_api_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a pod network there is no ServiceAccount mount and no `kubernetes` Service address."""
    monkeypatch.setenv("KUBECONFIG", "/host/loopback-kubeconfig")
    env = agent_class()(client.ApiClient(), tmp_path).build_env(*pod())
    assert env["KUBECONFIG"] == "/host/loopback-kubeconfig"
