"""The operator's life as an administrator sees it: `helm install`, leader election,
`helm upgrade`, `helm uninstall`. Real helm and kubectl against the test cluster; the
operator pods are real `rljob-operator` processes (run by the cluster's process agent) that
talk to the API server as the chart's ServiceAccount, so the chart's RBAC is exercised.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from tests.cluster.fixtures import Cluster, wait_for
from tests.e2e.conftest import (
    API_PORT,
    LEASE_NAME,
    METRICS_PORT,
    PID_ANNOTATION,
    OperatorRelease,
    pid_alive,
)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of a GET; HTTP errors are answers too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def control_url(pod: dict[str, Any], namespace: str) -> str:
    ip = pod["status"]["podIP"]
    return f"http://{ip}:{API_PORT}/apis/control.rljob.io/v1alpha1/namespaces/{namespace}/rljobs/nothing/cells"


def metrics_url(pod: dict[str, Any], path: str) -> str:
    return f"http://{pod['status']['podIP']}:{METRICS_PORT}{path}"


def test_helm_install_starts_two_replicas_and_exactly_one_leads(operator: OperatorRelease) -> None:
    assert f"NAME: {operator.name}" in operator.install_output
    assert "STATUS: deployed" in operator.install_output
    assert "namespace scope, 2 replicas with leader election" in operator.install_output
    assert "kubectl apply --server-side --force-conflicts -f crds/rljob.yaml" in operator.install_output

    pods = wait_for(lambda: operator.running_pods(2), timeout=120, what="2 Running operator pods with processes")
    for pod in pods:  # each pod is a real local process, started with the chart's command line
        assert pid_alive(int(pod["metadata"]["annotations"][PID_ANNOTATION]))
        args = pod["spec"]["containers"][0]["args"]
        assert f"--namespace={operator.namespace}" in args and "--controller-api-host=$(POD_IP)" in args
    leader = operator.wait_leader(pods)
    (standby,) = [p for p in pods if p is not leader]

    lease = operator.kubectl("get", "lease", LEASE_NAME).stdout
    assert leader["metadata"]["name"] in lease and standby["metadata"]["name"] not in lease

    # The standby answers the controller API with 503 + Retry-After, naming the leader once it
    # has read the Lease (it polls it every retry period) ...
    leader_name = leader["metadata"]["name"]
    status, headers, body = wait_for(
        lambda: (r := http_get(control_url(standby, operator.namespace)))[0] == 503 and leader_name in r[2] and r,
        timeout=30, what=f"standby answering 503 naming {leader_name}")
    assert headers.get("Retry-After") == "2"
    assert json.loads(body)["reason"] == "NotLeader"
    assert json.loads(body)["error"] == f"this operator replica is a standby (leader: {leader_name}); retry"
    # ... the leader gets past leadership to authentication: no token, 401.
    status, _, body = http_get(control_url(leader, operator.namespace))
    assert status == 401, body

    # Namespace scope: the operator's ServiceAccount acts in the watched namespace only.
    sa = f"system:serviceaccount:{operator.namespace}:{operator.name}"

    def can_i(*args: str) -> str:
        return operator.cluster.kubectl("auth", "can-i", *args, f"--as={sa}", check=False).stdout.strip()

    assert can_i("create", "pods", "-n", operator.namespace) == "yes"
    assert can_i("patch", "rljobs.rljob.io/status", "-n", operator.namespace) == "yes"
    assert can_i("create", "pods", "-n", "default") == "no"
    assert can_i("list", "rljobs.rljob.io", "--all-namespaces") == "no"
    assert can_i("create", "tokenreviews.authentication.k8s.io") == "yes"

    # Both are healthy (a standby is not broken) and say which they are.
    assert json.loads(http_get(metrics_url(leader, "/healthz"))[2]) == {"ok": True, "detail": "leader"}
    assert json.loads(http_get(metrics_url(standby, "/healthz"))[2]) == {"ok": True, "detail": "standby"}
    assert "rljob_operator_leader 1.0" in http_get(metrics_url(leader, "/metrics"))[2]
    assert "rljob_operator_leader 0.0" in http_get(metrics_url(standby, "/metrics"))[2]


def _leftovers(cluster: Cluster, release: OperatorRelease) -> dict[str, str]:
    """Objects of the release still in the cluster, by kind (namespaced and cluster-scoped)."""
    found: dict[str, str] = {}
    kinds = "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets,configmaps"
    out = release.kubectl("get", kinds, "-l", release.selector, "-o", "name").stdout.strip()
    if out:
        found["namespaced"] = out
    sa = release.kubectl("get", "serviceaccount", release.name, "--ignore-not-found", "-o", "name").stdout.strip()
    if sa:
        found["serviceaccount"] = sa
    out = cluster.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout
    mine = [line for line in out.splitlines() if release.name in line]
    if mine:
        found["cluster"] = "\n".join(mine)
    return found


def test_helm_upgrade_rolls_the_deployment_and_uninstall_leaves_only_the_crd(
    cluster: Cluster, operator: OperatorRelease
) -> None:
    before = wait_for(lambda: operator.running_pods(2), timeout=120, what="2 Running operator pods")
    operator.wait_leader(before)
    old_names = {p["metadata"]["name"] for p in before}
    old_pids = [int(p["metadata"]["annotations"][PID_ANNOTATION]) for p in before]

    res = operator.helm("upgrade", operator.name, "helm/rljob-operator", "--reuse-values",
                        "--set", "logLevel=DEBUG", "--wait", "--timeout", "180s")
    assert "has been upgraded" in res.stdout and "REVISION: 2" in res.stdout
    rollout = operator.kubectl("rollout", "status", f"deployment/{operator.name}", "--timeout=180s").stdout
    assert "successfully rolled out" in rollout

    def rolled() -> list[dict[str, Any]] | None:
        pods = operator.running_pods(2)
        return pods if pods and not old_names & {p["metadata"]["name"] for p in pods} else None

    after = wait_for(rolled, timeout=180, what="2 new Running operator pods, the old ones gone")
    for pod in after:
        assert "--log-level=DEBUG" in pod["spec"]["containers"][0]["args"]
    wait_for(lambda: not any(pid_alive(p) for p in old_pids), timeout=60, what="old operator processes exit")
    operator.wait_leader(after)  # the Lease passed to one of the new pods
    history = operator.helm("history", operator.name).stdout
    assert "superseded" in history and "Upgrade complete" in history

    new_pids = [int(p["metadata"]["annotations"][PID_ANNOTATION]) for p in after]
    out = operator.uninstall()
    assert f'release "{operator.name}" uninstalled' in out
    wait_for(lambda: _leftovers(cluster, operator) == {}, timeout=120, what="every object of the release deleted")
    wait_for(lambda: not any(pid_alive(p) for p in new_pids), timeout=60, what="operator processes exit")
    assert operator.helm("list", "-a", "-q").stdout.strip() == ""
    # Helm keeps CRDs on uninstall (documented: crds/ is install-only), so RLJobs survive.
    assert "rljobs.rljob.io" in cluster.kubectl("get", "crd", "rljobs.rljob.io").stdout
    # The Lease is the operator's runtime state, not an object of the release: it stays. Its
    # holder is not cleared: Helm deletes the ServiceAccount while the pods still terminate,
    # so the last leader's release is refused (401); a new install waits out the lease.
    lease = operator.kubectl("get", "lease", LEASE_NAME, "-o", "json").stdout
    assert "meta.helm.sh/release-name" not in lease
